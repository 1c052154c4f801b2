"""Tool calls in `speccli serve` (OpenAI's `tools`, `tool_choice`, `parallel_tool_calls`): the grammar a
reply follows in each of the two styles (speccli/server/tools.py), the calls read back whole and
streamed, a conversation that carries calls and results, and the 400s. The law under a grammar and its
proofs are tests/test_grammar.py's: a tool call is one more grammar."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import llguidance
import pytest

from speccli.core.constraint import Grammar, GrammarError, GrammarSpec
from speccli.llama.tokenizer import load_vocab_only
from speccli.server.tools import OPEN, ToolRequest, ToolStyle, tool_style_for
from tests.test_server import CHAT_TEMPLATE, MODEL, assert_openai_error, ask, client, post, serving
from tests.test_qwen_pair import qwen_files  # noqa: F401  (a fixture)
from tests.tiny_gguf import TinyConfig, spm_vocabulary, write_related_pair

WEATHER_PARAMETERS = {
    "type": "object", "additionalProperties": False, "required": ["city", "unit"],
    "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["celsius", "fahrenheit"]}},
}
ADD_PARAMETERS = {"type": "object", "required": ["a", "b"], "additionalProperties": False,
                  "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now",
                                            "parameters": WEATHER_PARAMETERS}}
ADD = {"type": "function", "function": {"name": "add", "parameters": ADD_PARAMETERS}}
# References into the parameters' own definitions, as pydantic writes nested models: they resolve against
# the parameters' root, which the grammar's schema nests.
BOOK_PARAMETERS = {"$defs": {"city": {"enum": ["Paris", "Rome"]}}, "type": "object", "additionalProperties": False,
                   "required": ["src", "dst"], "properties": {"src": {"$ref": "#/$defs/city"}, "dst": {"$ref": "#/$defs/city"}}}
BOOK = {"type": "function", "function": {"name": "book", "parameters": BOOK_PARAMETERS}}
NOW = {"type": "function", "function": {"name": "now"}}  # no parameters: it takes none (OpenAI's rule)
PARAMETERS = {"get_weather": WEATHER_PARAMETERS, "add": ADD_PARAMETERS, "book": BOOK_PARAMETERS,
              "now": {"type": "object", "additionalProperties": False}}
FUNCTIONS = (WEATHER["function"], ADD["function"], BOOK["function"], NOW["function"])
CONTEXT = 2048

# A template that writes tools and calls as hermes templates do, in a vocabulary without a <tool_call>
# token: the markers are text, written in pieces.
HERMES_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>{% endif %}"
    "{% for message in messages %}<{{ message['role'] }}>{{ message['content'] }}"
    "{% for call in message.tool_calls or [] %}<tool_call>{{ call.function | tojson }}</tool_call>{% endfor %}"
    "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def tools_pair(directory: Path, template: str) -> tuple[Path, Path]:
    vocab = replace(spm_vocabulary(512), chat_template=template)  # tools take room: a longer context
    return write_related_pair(directory, target_layers=4, draft_layers=2,
                              config=TinyConfig(vocab=vocab, context_length=CONTEXT), name=directory.name)


@pytest.fixture(scope="module")
def json_pair(tiny_dir: Path) -> tuple[Path, Path]:
    return tools_pair(tiny_dir / "tools_json", CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def hermes_pair(tiny_dir: Path) -> tuple[Path, Path]:
    return tools_pair(tiny_dir / "tools_hermes", HERMES_TEMPLATE)


@pytest.fixture(scope="module")
def qwen_vocabulary(qwen_files):
    with load_vocab_only(qwen_files.target_path) as tokenizer:
        yield tokenizer


def accepts(tokenizer, grammar: Grammar, text: str) -> bool:
    """Whether a fresh matcher takes the text's tokens (as the model would write them) and may end there."""
    matcher = llguidance.LLMatcher(tokenizer.grammar_vocabulary(), grammar.definition, log_level=0)
    return all(matcher.consume_token(token) for token in tokenizer.tokenize(text, False, True)) and matcher.is_accepting()


def hermes(*calls: tuple[str, dict]) -> str:
    return "\n".join(f'{OPEN}\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>' for name, arguments in calls)


PARIS, SUM = ("get_weather", {"city": "Paris", "unit": "celsius"}), ("add", {"a": 1, "b": 2})


@pytest.mark.parametrize("choice, parallel, text, allowed", [
    ("auto", True, "It is sunny.", True),
    ("auto", True, "Let me look.\n" + hermes(PARIS), True),
    ("auto", True, hermes(PARIS, SUM) + "\n", True),
    ("auto", False, hermes(PARIS, SUM), False),  # one call at most
    ("required", True, "It is sunny.", False),
    ("required", True, hermes(SUM), True),
    ("add", True, hermes(PARIS), False),  # the one function named
    ("add", True, hermes(SUM), True),
    ("required", True, hermes(("get_weather", {"city": "Paris"})), False),  # a required argument missing
    ("required", True, hermes(("get_weather", {"city": "Paris", "unit": "kelvin"})), False),
    ("required", True, hermes(("get_weather", {"city": "Paris", "unit": "celsius", "x": 1})), False),
    ("required", True, hermes(("send_mail", {})), False),
    ("required", True, hermes(("book", {"src": "Paris", "dst": "Rome"})), True),
    ("required", True, hermes(("book", {"src": "Paris", "dst": "Oslo"})), False),  # not among the definition's
    ("required", True, hermes(("now", {})), True),
    ("required", True, hermes(("now", {"tz": "UTC"})), False),  # a function without parameters takes none
])
def test_a_hermes_models_calls_follow_the_choice_and_the_parameters(qwen_vocabulary, choice, parallel, text, allowed):
    """On Qwen 2.5's vocabulary, whose template writes <tool_call> as a token of its own."""
    style = tool_style_for(qwen_vocabulary.chat_template, qwen_vocabulary.is_special_text(OPEN))
    assert style == ToolStyle("hermes", special_markers=True)
    spec = style.grammar(ToolRequest(FUNCTIONS, choice, parallel))
    assert accepts(qwen_vocabulary, Grammar(spec, qwen_vocabulary.grammar_vocabulary(), qwen_vocabulary.n_vocab), text) is allowed


@pytest.mark.parametrize("schema, reply, lead", [
    ({"const": "</tool_call>"}, '"</tool_call>"', ""),
    ({"type": "object", "required": ["tag"], "additionalProperties": False, "properties": {"tag": {"enum": ["</tool_call>"]}}},
     '{"tag": "</tool_call>"}', '{"tag": '),
])
def test_forced_text_that_spells_a_special_token_is_written_as_text(qwen_vocabulary, schema, reply, lead):
    """Forced bytes "</tool_call>" tokenize to Qwen's special token, which a grammar's string does not take:
    the forced tokens stop before it (serve had answered 500, "the grammar allows no token here"), and the
    text's ordinary tokens complete the reply. The control: llguidance's forced tokens, taken whole, fail."""
    def ordinary(text: str) -> list[int]:  # a piece at a time: never a special token
        return [token for piece in text for token in qwen_vocabulary.tokenize(piece, False, False)]

    grammar = Grammar(GrammarSpec.json_schema(schema), qwen_vocabulary.grammar_vocabulary(), qwen_vocabulary.n_vocab)
    constraint = grammar.start()
    constraint.push(ordinary(lead))
    forced = constraint.forced(64)
    constraint.push(forced)
    rest = reply[len(lead) + len(qwen_vocabulary.detokenize(forced).decode()):]
    assert "</tool_call>" in rest and constraint.accepts(ordinary(rest))
    control = grammar.start()
    control.push(ordinary(lead))
    with pytest.raises(GrammarError, match="allows no token here"):
        control.push(control._matcher.compute_ff_tokens())


# A reference into its own definitions, as pydantic writes a nested model: re-pointed where the grammar nests it.
CITY = {"$defs": {"City": {"enum": ["Paris", "Rome"]}}, "type": "object", "additionalProperties": False,
        "required": ["city"], "properties": {"city": {"$ref": "#/$defs/City"}}}


@pytest.mark.parametrize("text, allowed", [
    ('{"city": "Paris"}', True),
    (hermes(PARIS), True),
    ("Let me look.\n" + hermes(PARIS), False),  # no text leads into a call here
    ("It is sunny.", False),  # a reply that calls nothing is the answer's JSON
    ('{"town": "Paris"}', False),
    ('{"city": "Oslo"}', False),
    ('{"name": "add", "arguments": {"a": 1, "b": 2}}', True),  # a call as bare JSON, as Qwen 2.5 Coder writes them
    ('{"name": "add", "arguments": {"a": 1}}', False),
])
def test_under_auto_a_response_format_holds_a_reply_that_calls_nothing(qwen_vocabulary, text, allowed):
    """tools with response_format (pydantic-ai's NativeOutput beside a tool, LangChain's ProviderStrategy):
    a call, or JSON that follows the schema. It had been a 400."""
    style = ToolStyle("hermes", special_markers=True)
    spec = style.grammar(ToolRequest(FUNCTIONS, "auto", True, answer=CITY))
    assert accepts(qwen_vocabulary, Grammar(spec, qwen_vocabulary.grammar_vocabulary(), qwen_vocabulary.n_vocab), text) is allowed


def test_a_hermes_reply_reads_back_as_content_and_calls():
    style = ToolStyle("hermes", True)
    content, calls = style.read("Let me look.\n" + hermes(PARIS, SUM) + "\n")
    assert content == "Let me look."
    assert [(call["function"]["name"], json.loads(call["function"]["arguments"])) for call in calls] == [PARIS, SUM]
    assert all(call["type"] == "function" and call["id"].startswith("call_") for call in calls)
    assert len({call["id"] for call in calls}) == 2
    assert style.read("It is sunny.") == ("It is sunny.", [])
    cut = "Sure.\n" + hermes(PARIS)[:30]  # max_tokens ended it inside a call: all of it is content
    assert style.read(cut) == (cut, [])
    unclosed = hermes(PARIS).removesuffix("\n</tool_call>")  # cut after the JSON, before its end marker
    assert style.read(unclosed) == (unclosed, [])
    # A marker inside an argument's string is the string's (the call's JSON is read whole).
    note = ("note", {"text": "ends with </tool_call> then <tool_call>\n{"})
    assert [json.loads(call["function"]["arguments"]) for call in style.read(hermes(note, SUM))[1]] == [note[1], SUM[1]]
    # Streamed: the text up to where a call may begin, whitespace held back (it may lead into one).
    assert [style.shown_so_far(text) for text in ("Sure", "Sure \n", "Sure <tool", "Sure.\n<tool_call>\n{", "a < b")] == \
        ["Sure", "Sure", "Sure", "Sure.", "a < b"]


def test_other_templates_get_the_tools_in_a_system_message_and_reply_in_json():
    style = tool_style_for("{{ messages }}", False)
    assert style == ToolStyle("json")
    tools = ToolRequest((ADD["function"],), "auto", False)
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
        {"role": "user", "content": "Thanks."},
    ]
    assert style.prompt_messages(conversation, tools) == [
        {"role": "system", "content": "Be brief.\n\nYou can call these tools:\n" + json.dumps(ADD["function"]) +
         '\n\nTo call a tool, reply with one JSON object: {"tool_call": {"name": <tool name>, "arguments": {...}}}; '
         'to answer directly, reply {"response": <your answer>}.'},
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "content": '{"tool_call": {"name": "add", "arguments": {"a": 1, "b": 2}}}'},
        {"role": "user", "content": '{"tool_response": {"tool_call_id": "c1", "content": "3"}}\n\nThanks.'},  # turns alternate
    ]
    untold = style.prompt_messages(conversation, ToolRequest(tools.functions, "none", False))  # "none": no tools told
    assert untold[0] == {"role": "system", "content": "Be brief."} and len(untold) == 4
    assert style.read('{"response": "3"}') == ("3", [])
    content, calls = style.read('{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}')
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}


def valid_calls(message, named: str | None = None) -> int:
    assert message.content is None
    for call in message.tool_calls:
        assert named in (None, call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])
    return len(message.tool_calls)


@pytest.mark.parametrize("pair", ["json_pair", "hermes_pair"])
def test_with_tools_a_reply_that_calls_nothing_follows_the_response_format(pair, request):
    """The tiny pair's noise under `auto`, tools beside a json_schema response_format: each reply that ends
    is calls of the functions offered, or content that is JSON following the schema (a json-style reply's
    answer is given back as its JSON text)."""
    form = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}
    with serving(request.getfixturevalue(pair), n_ctx=CONTEXT) as url:
        c = client(url)
        ended = 0
        for temperature, seed in ((0, 0), (0.8, 1), (1.5, 2), (1.5, 3)):
            reply = ask(c, "Weather in Paris?", tools=[WEATHER, ADD], response_format=form, temperature=temperature,
                        seed=seed, max_tokens=200).choices[0]
            if reply.finish_reason == "length":
                continue
            ended += 1
            if reply.finish_reason == "tool_calls":  # text may come before a hermes call
                for call in reply.message.tool_calls:
                    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])
            else:
                assert reply.finish_reason == "stop"
                jsonschema.validate(json.loads(reply.message.content), CITY)
        assert ended >= 2


@pytest.mark.parametrize("pair", ["json_pair", "hermes_pair"])
def test_every_call_follows_its_functions_parameters_whole_and_streamed(pair, request):
    """The tiny pair's replies are noise, so only the grammar makes them calls: every reply that ends is
    one or more calls of the functions offered, with arguments their parameters allow, in either style."""
    with serving(request.getfixturevalue(pair), n_ctx=CONTEXT) as url:
        c = client(url)
        calls = 0
        for choice, parallel in (("required", True), ({"type": "function", "function": {"name": "add"}}, False)):
            named = None if choice == "required" else "add"
            for temperature, seed in ((0, 0), (0.8, 1), (1.5, 2)):
                reply = ask(c, "Weather in Paris?", tools=[WEATHER, ADD, BOOK, NOW], tool_choice=choice, parallel_tool_calls=parallel,
                            temperature=temperature, seed=seed, max_tokens=200)
                if reply.choices[0].finish_reason == "length":
                    continue
                assert reply.choices[0].finish_reason == "tool_calls"
                calls += valid_calls(reply.choices[0].message, named)
                assert parallel or len(reply.choices[0].message.tool_calls) == 1
        assert calls >= 4
        # The control: without the grammar (tool_choice "none") the same noise calls nothing.
        unconstrained = ask(c, "Weather in Paris?", tools=[WEATHER, ADD], tool_choice="none", max_tokens=60).choices[0]
        assert unconstrained.message.tool_calls is None and unconstrained.finish_reason in ("stop", "length")
        for choice in ("required", "auto"):
            whole = ask(c, "Weather in Paris?", tools=[WEATHER, ADD], tool_choice=choice, max_tokens=200).choices[0]
            chunks = [chunk.choices[0] for chunk in ask(c, "Weather in Paris?", tools=[WEATHER, ADD], tool_choice=choice,
                                                         max_tokens=200, stream=True) if chunk.choices]
            assert "".join(chunk.delta.content or "" for chunk in chunks) == (whole.message.content or "")
            # As OpenAI sends it: a reply that can only be calls has no content, not an empty one.
            assert (chunks[0].delta.role, chunks[0].delta.content) == ("assistant", None if choice == "required" else "")
            streamed = streamed_calls(chunks)
            assert [(name, json.loads(arguments)) for name, arguments, _ in streamed] == \
                [(call.function.name, json.loads(call.function.arguments)) for call in whole.message.tool_calls or ()]
            assert all(pieces > 1 for _, _, pieces in streamed)  # the arguments came as they were written
            assert chunks[-1].finish_reason == whole.finish_reason
        # Cut by max_tokens inside a call: "length", and arguments streamed short of their end never parse.
        whole = ask(c, "Weather in Paris?", tools=[WEATHER, ADD], tool_choice="required", max_tokens=200)
        written = whole.usage.completion_tokens
        cut_short = 0
        for tokens in sorted({2, written // 3, written // 2, 2 * written // 3, written - 3}):
            chunks = [chunk.choices[0] for chunk in ask(c, "Weather in Paris?", tools=[WEATHER, ADD], tool_choice="required",
                                                         max_tokens=tokens, stream=True) if chunk.choices]
            assert chunks[-1].finish_reason == "length"
            assert not "".join(chunk.delta.content or "" for chunk in chunks)  # the call's text is not content, begun or not
            for (_, arguments, _), call in zip(streamed_calls(chunks), whole.choices[0].message.tool_calls):
                try:
                    parsed = json.loads(arguments)
                except ValueError:
                    cut_short += 1  # cut inside the arguments
                else:
                    assert parsed == json.loads(call.function.arguments)  # whole: the cut came after them
        assert cut_short


@pytest.mark.parametrize("answer", ["Sunny, 21 \u00b0C \U0001F600 in \"Paris\"\\n", ""])
def test_a_json_replys_text_answer_streams_as_it_is_written(answer):
    """A json-style reply under `auto` is `{"response": "..."}`: its text had come only at the end. At every
    cut, the content shown is a beginning of the answer (an escape begun, or half a surrogate pair, held
    back), and all of it once whole; a cut reply's content is its answer so far. A call shows nothing. A
    stream keeps how far it decoded (each token decodes only what it added) and shows the same."""
    style = ToolStyle("json")
    for text in (json.dumps({"response": answer}), json.dumps({"response": answer}, ensure_ascii=False, indent=1)):
        shown = [style.shown_so_far(text[:cut]) for cut in range(len(text) + 1)]
        assert all(answer.startswith(part) for part in shown) and shown[-1] == answer == style.read(text)[0]
        decoded: dict = {}
        assert [style.shown_so_far(text[:cut], decoded=decoded) for cut in range(len(text) + 1)] == shown
        assert decoded["answer"][1] == answer
    assert style.shown_so_far('{"response": "x"}', answered_in_text=False) == ""  # JSON under response_format: at the end
    call = json.dumps({"tool_call": {"name": "add", "arguments": {"a": "{\"response\": \"x"}}})
    assert [style.shown_so_far(call[:cut]) for cut in range(len(call) + 1)] == [""] * (len(call) + 1)


def streamed_calls(chunks) -> list[tuple[str, str, int]]:
    """Each call a stream made, as a client puts its deltas together: (name, arguments, deltas it came in)."""
    calls: dict[int, list] = {}
    for chunk in chunks:
        for delta in chunk.delta.tool_calls or ():
            call = calls.setdefault(delta.index, [delta.function.name, "", 0])
            assert delta.id is None or call[2] == 0  # the id and name come once, first
            call[1] += delta.function.arguments or ""
            call[2] += 1
    return [tuple(call) for _, call in sorted(calls.items())]


@pytest.mark.parametrize("style, text", [
    ("hermes", "Let me look.\n" + hermes(PARIS, ("book", {"src": "Paris", "dst": "Rome}{\"[]"}))),
    ("hermes", hermes(("note", {"text": "</tool_call>\n<tool_call>\n{\"name\": \"x\", \"arguments\": {"}), SUM)),
    ("json", json.dumps({"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": [2, {"c": "}"}]}}, {"name": "now", "arguments": {}}]})),
    ("json", json.dumps({"tool_call": {"name": "get_weather", "arguments": {"city": "Pa\\ris\"", "unit": "celsius"}}}, indent=2)),
])
def test_a_streamed_calls_arguments_grow_with_the_text_and_close_only_when_whole(style, text):
    """At every cut of a reply's text, the calls read so far are those of the whole text, each one's
    arguments a beginning of its whole arguments, which parse only once the text has them all (so a stream
    cut short never hands a client arguments that parse). The read of the whole text is `read`'s calls."""
    tool_style = ToolStyle(style)
    whole = tool_style.calls_so_far(text)
    assert [(name, json.loads(arguments)) for name, arguments in whole] == \
        [(call["function"]["name"], json.loads(call["function"]["arguments"])) for call in tool_style.read(text)[1]]
    scanned: dict = {}  # as a stream keeps it: each read goes on from the last
    for cut in range(len(text)):
        assert tool_style.calls_so_far(text[:cut], scanned) == tool_style.calls_so_far(text[:cut])
        for (name, arguments), (whole_name, whole_arguments) in zip(tool_style.calls_so_far(text[:cut]), whole):
            assert name == whole_name and whole_arguments.startswith(arguments)
            if arguments != whole_arguments:
                with pytest.raises(ValueError):
                    json.loads(arguments)
    assert ToolStyle(style).calls_so_far(text.replace('"name"', '"nom"')) == []  # the control: not a call, nothing read


def test_a_conversation_carries_calls_and_their_results(hermes_pair):
    """An assistant's calls and the tools' results go back through the template, as the client sends them."""
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'}]
    with serving(hermes_pair, n_ctx=CONTEXT) as url:
        reply = client(url).chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=8, temperature=0)
        assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
        status, reply, _ = post(url, "/v1/chat/completions", {"model": MODEL, "messages": messages, "tools": [WEATHER],
                                                              "tool_choice": None, "parallel_tool_calls": None, "max_tokens": 8})
        assert status == 200, reply  # a null is the default, as for every other field


@pytest.mark.parametrize("fields, param, message", [
    ({"tool_choice": {"type": "function", "function": {"name": "send_mail"}}}, "tool_choice", "tool_choice: no tool is named 'send_mail'"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice", "tool_choice: asks for a tool call, and tools gives none"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "tools: two are named 'get_weather'"),
    ({"grammar": 'root ::= "a"'}, "tools", 'tools: a reply that may call a tool follows its grammar; leave out grammar '
     '(response_format may go with tools), or set tool_choice to "none"'),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
     "response_format", "response_format.json_schema.schema: at /type: Invalid type: objekt"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "objekt"}}}}}]},
     "tools.0.function.parameters", "tools.0.function.parameters: at /properties/a/type: Invalid type: objekt"),
    # The Responses API's shape of a named choice had named a class of the schema (NamedToolChoice).
    ({"tool_choice": {"type": "function", "name": "f"}}, "tool_choice.function", "tool_choice.function: Field required"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]}, "tools.0.function.parameters",
     'tools.0.function.parameters: must describe the arguments as an object ("type": "object"), got "type": "array"'),
    ({"tool_choice": "required", "stop": ["}"]}, "stop",
     "stop: a reply that follows tools would be cut by a stop string before it is complete; leave stop out"),
    ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools.0.function.name", None),
    ({"messages": [{"role": "tool", "content": "3"}]}, "messages.0.tool_call_id", "messages.0.tool_call_id: a tool's message names the call it answers"),
    ({"messages": [{"role": "user", "content": "hi", "tool_calls": []}]}, "messages.0.tool_calls", "messages.0.tool_calls: only an assistant's message has them"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{x"}}]}]},
     "messages.0.tool_calls.0.function.arguments", "messages.0.tool_calls.0.function.arguments: must be a JSON object, as text"),
])
def test_tool_requests_that_cannot_be_served_are_a_400_naming_the_field(json_pair, fields, param, message):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "tools": [WEATHER], **fields}
    with serving(json_pair, n_ctx=CONTEXT) as url:
        status, error, _ = post(url, "/v1/chat/completions", body)
        assert_openai_error(status, error, 400)
        assert error["error"]["param"] == param
        if message is not None:
            assert error["error"]["message"] == message
        status, error, _ = post(url, "/v1/completions", {"model": MODEL, "prompt": "hi", "tools": [WEATHER]})
        assert_openai_error(status, error, 400)
        assert error["error"]["message"] == "tools: only chat completions (/v1/chat/completions) call tools"


def fenced(call: tuple[str, dict], lead: str = "```json\n", end: str = "\n```") -> str:
    return f'{lead}{json.dumps({"name": call[0], "arguments": call[1]}, indent=2)}{end}'


# Nested models as pydantic writes them: objects in an array, through a reference.
TRIP = {"name": "plan_trip", "parameters": {
    "$defs": {"Stop": {"type": "object", "additionalProperties": False, "required": ["city", "nights"],
                       "properties": {"city": {"enum": ["Paris", "Rome"]}, "nights": {"type": "integer"}}}},
    "type": "object", "additionalProperties": False, "required": ["by", "stops"],
    "properties": {"by": {"enum": ["rail", "road"]}, "stops": {"type": "array", "items": {"$ref": "#/$defs/Stop"}, "maxItems": 2}}}}


def test_a_call_written_as_bare_json_under_auto_is_read_where_its_tool_takes_it(hermes_pair):
    """Qwen 2.5 Coder writes its calls under `auto` as a markdown JSON block, not in <tool_call> (no call
    came back in 6 tries of a hostile pass): such a reply, whole, is read as a call where it names a tool
    offered and its arguments pass the grammar a call in <tool_call> follows (llama.cpp's Hermes parser
    reads them too, unchecked)."""
    from speccli.llama.model import LoadOptions, Model
    from speccli.server.launch import ServeSettings, build_service

    options = LoadOptions(n_ctx=CONTEXT, n_threads=1)
    with Model(hermes_pair[0], options) as target, Model(hermes_pair[1], options) as draft:
        service = build_service(MODEL, target, draft, ServeSettings(port=0, spec="model", k=3))
        assert service.loose_calls(ToolRequest(FUNCTIONS, "required", True)) is None  # held to the grammar there
        offered = service.loose_calls(ToolRequest((*FUNCTIONS, TRIP), "auto", True))
        style = service.tool_style
        for text in (fenced(PARIS), fenced(SUM, "```\n"), fenced(SUM, "", ""), " " + fenced(("book", {"src": "Rome", "dst": "Paris"})),
                     fenced(("get_weather", {"unit": "celsius", "city": "Paris"})),  # JSON leaves the order free,
                     fenced(("plan_trip", {"stops": [{"nights": 2, "city": "Rome"}], "by": "rail"}))):  # nested too
            content, calls = style.read(text, offered)
            assert content is None and len(calls) == 1 and json.loads(calls[0]["function"]["arguments"]) == json.loads(text.strip("`json \n"))["arguments"]
        for text in (fenced(("get_weather", {"city": "Paris", "unit": "kelvin"})),  # not among its enum
                     fenced(("send_mail", {})),  # no tool of that name
                     fenced(("now", {"tz": "UTC"})),  # it takes no arguments
                     fenced(("plan_trip", {"stops": [{"nights": "two", "city": "Rome"}], "by": "rail"})),  # not an integer
                     "Here: " + fenced(PARIS),  # not the whole reply
                     fenced(PARIS)[:-3]):  # a block not closed (cut short)
            assert style.read(text, offered) == (text, []), text
        assert style.read(fenced(PARIS)) == (fenced(PARIS), [])  # not read where not asked (not under auto)
        # Streamed, a reply that may still become one is held back; any other streams as before.
        shown = [len(style.shown_so_far(text, loose=True)) for text in ("```", "```json\n{", "  {", "```python\nx = 1", "Sure")]
        assert shown == [0, 0, 0, 15, 4] and style.shown_so_far("```json\n{", loose=False) == "```json\n{"


def test_the_grammar_vocabulary_is_built_once_when_requests_ask_at_once(tiny_model: Path, monkeypatch) -> None:
    """serve's first requests under schemas ask for it together: each had built its own (seconds each at
    262k tokens, on 2 cores), and the first burst waited for all of them."""
    import threading
    import time

    from speccli.llama.tokenizer import Tokenizer

    builds, build = [], Tokenizer._build_grammar_vocabulary

    def slow_build(self):
        builds.append(1)
        time.sleep(0.2)  # long enough that every thread asks while it runs
        return build(self)

    monkeypatch.setattr(Tokenizer, "_build_grammar_vocabulary", slow_build)
    with load_vocab_only(tiny_model) as tokenizer:
        start, got = threading.Barrier(4), []
        threads = [threading.Thread(target=lambda: (start.wait(), got.append(tokenizer.grammar_vocabulary()))) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(builds) == 1 and len(got) == 4 and all(vocabulary is got[0] for vocabulary in got)
