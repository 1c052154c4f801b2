"""Benchmark (not a test): `speccli serve --parallel N` under load, with clients that leave mid-reply.

    flock /tmp/ggml.lock .venv/bin/python tests/benchmarks/serve_faults.py --target T.gguf [--draft D.gguf]
        [--clients 16] [--requests 200] [--drop 0.1] [--max-tokens 48]

`--clients` threads send `--requests` greedy requests of the mixed workload (serve_clients.py's) to a
server with as many slots, streamed; a tenth of them (every request whose index is 9 mod 10) are
closed by their client after their third chunk. Then the same requests, none dropped, go one at a time
to a server with one slot. It prints the server errors (5xx and failed connections), how many completed
replies equal the one-slot run's (and why each other one parts: serve_clients.py's `explain`), and the
server's resident memory after request 50 and at the end.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_clients import explain, mixed_workload, speccli_server  # noqa: E402
from serve_workload import Prompts  # noqa: E402


def resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run(port: int, prompts: list[list[int]], clients: int, args, drop: bool, pid: int) -> tuple[dict[int, str], int, list[float]]:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    queue, lock, texts, errors, memory = list(enumerate(prompts)), threading.Lock(), {}, [0], []

    def one(index: int, prompt: list[int]) -> None:
        try:
            stream = client.completions.create(model=model, prompt=prompt, max_tokens=args.max_tokens, temperature=0,
                                               stream=True, stop=list(args.prompts.format.stop) or None)
            chunks = []
            for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    chunks.append(chunk.choices[0].text)
                if drop and index % 10 == 9 and len(chunks) == 3:
                    stream.close()  # the client leaves mid-reply
                    return
            with lock:
                texts[index] = "".join(chunks)
        except (openai.APIError, OSError):
            with lock:
                errors[0] += 1

    def loop() -> None:
        while True:
            with lock:
                if not queue:
                    return
                index, prompt = queue.pop(0)
                if index == 50:
                    memory.append(resident_mib(pid))
            one(index, prompt)

    threads = [threading.Thread(target=loop) for _ in range(clients)]
    [thread.start() for thread in threads]
    [thread.join() for thread in threads]
    memory.append(resident_mib(pid))
    return texts, errors[0], memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--draft", type=Path)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--ctx", type=int, default=1024, help="context per slot")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--ngl", type=int, default=0, help="layers of each model offloaded (99: all)")
    args = parser.parse_args()
    args.prompts = Prompts(args.target)
    prompts = [args.prompts.ids(messages) for messages in mixed_workload(args.requests)]
    server, _ = speccli_server(args, "default", args.clients)
    with server:
        together, errors, memory = run(server.port, prompts, args.clients, args, True, server.process.pid)
    server, _ = speccli_server(args, "default@1", 1)
    with server:
        alone, alone_errors, _ = run(server.port, prompts, 1, args, False, server.process.pid)
    dropped = sum(1 for i in range(args.requests) if i % 10 == 9)
    equal = sum(together[i] == alone.get(i) for i in together)
    print(f"{args.clients} clients, {args.requests} requests ({dropped} dropped by their clients), {args.max_tokens} tokens, greedy")
    print(f"  server errors: {errors} (one slot, none dropped: {alone_errors})")
    print(f"  completed: {len(together)}; equal to the one-slot run's reply: {equal}")
    print(f"  resident memory: {memory[0]:.0f} MiB after request 50, {memory[-1]:.0f} MiB at the end "
          f"({memory[-1] / memory[0] - 1:+.1%})")
    explain(args, prompts, [(i, alone[i], together[i]) for i in sorted(together) if i in alone and together[i] != alone[i]])


if __name__ == "__main__":
    main()
