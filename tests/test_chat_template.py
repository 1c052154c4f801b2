"""Chat prompts are exactly llama-cpp-python's: speccli's rendering and tokenization of a conversation
(system, user and assistant turns, non-ASCII text) against what `Llama.create_chat_completion` feeds
the model, for Gemma 3's template and the Qwen2.5-Coder GGUF's own; plus templates speccli's former
copy of the renderer got wrong (`{% generation %}`, `tojson`)."""
from __future__ import annotations

from pathlib import Path

import llama_cpp
import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from speccli.chat.conversation import Conversation
from speccli.chat.template import PlainTranscript, TemplateFormat, chat_format_for
from speccli.llama.tokenizer import load_vocab_only
from speccli.models.config import load_registry
from speccli.models.resolve import resolve_model

# Gemma 3's chat template (google/gemma-3-270m-it, tokenizer_config.json). The bundled Gemma GGUF is
# the base model and carries none.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)
SYSTEM = "Réponds brièvement, s'il te plaît."
TURNS = [("¿Qué es π? 日本語で", "π ≈ 3,14159 — «pi», 円周率です。"), ("Merci ! Und auf Deutsch: Größe?", None)]


def conversation_through_speccli(path: Path, chat_format) -> list[int]:
    """The tokens speccli's Conversation would prefill for TURNS' last message."""
    with load_vocab_only(path) as tokenizer:
        conversation = Conversation(tokenizer, chat_format, SYSTEM)
        for user, reply in TURNS[:-1]:
            prompt = conversation.prompt_for(user)
            conversation.add_turn(user, prompt, tokenizer.tokenize(reply, False, False), reply)
        return conversation.prompt_for(TURNS[-1][0]).tokens


def messages() -> list[dict[str, str]]:
    result = [{"role": "system", "content": SYSTEM}]
    for user, reply in TURNS:
        result.append({"role": "user", "content": user})
        if reply is not None:
            result.append({"role": "assistant", "content": reply})
    return result


def tokens_llama_cpp_python_would_decode(path: Path, chat_handler=None) -> list[int]:
    """What `Llama.create_chat_completion` hands to generation: its prompt tokens, caught there."""

    class Caught(Exception):
        pass

    llama = llama_cpp.Llama(str(path), vocab_only=True, verbose=False, chat_handler=chat_handler)
    caught: list[int] = []

    def create_completion(prompt, **_):
        caught.extend(prompt)
        raise Caught

    llama.create_completion = create_completion
    with pytest.raises(Caught):
        llama.create_chat_completion(messages(), temperature=0)
    return caught


@pytest.fixture(scope="module")
def gemma_file() -> Path:
    return resolve_model("gemma3-270m-q4km", load_registry(), quiet=True)


@pytest.fixture(scope="module")
def qwen_file() -> Path:
    return resolve_model("qwen2.5-coder-1.5b-instruct-q4km", load_registry(), quiet=True)


@pytest.mark.gemma
def test_gemma3_template_prompt_equals_llama_cpp_pythons(gemma_file):
    with load_vocab_only(gemma_file) as tokenizer:
        bos, eos = tokenizer.token_text(tokenizer.bos_id), tokenizer.token_text(tokenizer.eos_id)
    assert (bos, eos) == ("<bos>", "<eos>")
    chat_format = TemplateFormat(GEMMA3_TEMPLATE, bos, eos)
    expected_text = Jinja2ChatFormatter(GEMMA3_TEMPLATE, eos_token=eos, bos_token=bos)(messages=messages()).prompt
    assert chat_format.render(messages()) == expected_text
    assert "<start_of_turn>model\nπ ≈ 3,14159 — «pi», 円周率です。<end_of_turn>" in expected_text

    handler = Jinja2ChatFormatter(GEMMA3_TEMPLATE, eos_token=eos, bos_token=bos).to_chat_handler()
    assert conversation_through_speccli(gemma_file, chat_format) == tokens_llama_cpp_python_would_decode(gemma_file, handler)


@pytest.mark.qwen
def test_qwen_gguf_template_prompt_equals_llama_cpp_pythons(qwen_file):
    with load_vocab_only(qwen_file) as tokenizer:
        chat_format, fallback_reason = chat_format_for(tokenizer)
        template = tokenizer.chat_template
    assert isinstance(chat_format, TemplateFormat) and fallback_reason is None
    rendered = chat_format.render(messages())
    assert rendered.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n") and rendered.endswith("<|im_start|>assistant\n")
    expected_text = Jinja2ChatFormatter(template, eos_token="<|im_end|>", bos_token="")(messages=messages()).prompt
    assert rendered == expected_text
    # Llama picks the GGUF's template by itself here: the whole path, template to tokens, is compared.
    assert conversation_through_speccli(qwen_file, chat_format) == tokens_llama_cpp_python_would_decode(qwen_file)


def test_a_template_with_generation_tags_renders_instead_of_falling_back():
    template = (
        "{% for message in messages %}{% if message['role'] == 'assistant' %}{% generation %}"
        "A: {{ message['content'] }}\n{% endgeneration %}{% else %}U: {{ message['content'] }}\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}A:{% endif %}"
    )
    chat_format = TemplateFormat(template, "", "")
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "héllo"}, {"role": "user", "content": "?"}]
    assert chat_format.render(turns) == "U: hi\nA: héllo\nU: ?\nA:"


def test_tojson_keeps_key_order_and_text_as_written():
    chat_format = TemplateFormat("{{ messages | tojson }}", "", "")
    rendered = chat_format.render([{"role": "user", "content": "<b>café</b> & 日本"}])
    assert rendered == '[{"role": "user", "content": "<b>café</b> & 日本"}]'


def test_plain_transcript_for_models_without_a_template(tiny_model):
    with load_vocab_only(tiny_model) as tokenizer:
        chat_format, fallback_reason = chat_format_for(tokenizer)
    assert isinstance(chat_format, PlainTranscript) and "no chat template" in fallback_reason
    assert chat_format.render(messages()[:3]) == (
        f"{SYSTEM}\n\nUser: {TURNS[0][0]}\nAssistant:{TURNS[0][1]}\nAssistant:"
    )
