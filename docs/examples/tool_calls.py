"""A tool-calling conversation with `speccli serve`, through the openai package, as an agent runs one:
the model calls get_weather, the client answers with the tool's result, the model replies.

    speccli serve qwen2.5-coder-1.5b &      # or any pair; prints its URL
    python docs/examples/tool_calls.py [URL]

The transcript in docs/server.md#tool-calls is this script's output."""
import json
import sys

import openai

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}


def weather(city: str, unit: str) -> dict:
    return {"city": city, "temperature": 18 if unit == "celsius" else 64, "unit": unit, "sky": "cloudy"}


client = openai.OpenAI(base_url=f"{URL}/v1", api_key="unused")
model = client.models.list().data[0].id
messages = [{"role": "system", "content": "You are a helpful assistant. Once a tool has answered, reply to the user in one plain sentence."},
            {"role": "user", "content": "What is the weather in Paris now, in celsius?"}]
print(f"user: {messages[-1]['content']}")
for turn in range(3):  # a call, its answer; bounded, should the model call again and again
    reply = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER],
                                           tool_choice="required" if turn == 0 else "auto", temperature=0, max_tokens=200)
    message = reply.choices[0].message
    sources = reply.model_extra["speculative"]["by_source"]
    drafted = ", ".join(f"{name} {figures['accepted']}/{figures['drafted']}" for name, figures in sources.items())
    print(f"assistant ({reply.choices[0].finish_reason}; kept/drafted: {drafted or 'none'}):")
    if message.content:
        print(f"  {message.content}")
    messages.append(message.model_dump(exclude_none=True))
    if not message.tool_calls:
        break
    for call in message.tool_calls:
        result = weather(**json.loads(call.function.arguments))
        print(f"  calls {call.function.name}({call.function.arguments}) -> {json.dumps(result)}")
        messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
