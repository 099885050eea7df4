"""A measuring harness: prompt log-probs over the OpenAI legacy ``/v1/completions`` wire format, fast.

    /tmp/llmvenv/bin/python benchmarks/logprob_server.py --model SmolLM2.gguf --port 8766 \
        --chat-upstream http://127.0.0.1:8765

Why it exists: the logprob attribution method needs ``echo`` + ``logprobs`` (vLLM serves that). llama.cpp's
Python server also does, but builds ``top_logprobs`` by sorting the whole vocabulary in Python for every
prompt token (≈ 40 s for a 1,500-token prompt on 2 cores), which would make the measurement take hours.
This harness runs the same model with ``llama_cpp.Llama(logits_all=True)``, reuses the KV cache for the
common token prefix of consecutive requests, and computes the log-probs with numpy. Offsets count the
detokenized text, where special tokens are empty, exactly as llama.cpp's server does (and unlike vLLM),
so the client's end-anchored parsing is exercised. ``/v1/chat/completions`` and ``/v1/models`` are
forwarded to ``--chat-upstream`` so one base URL serves the whole engine.

It runs in the llama-cpp venv (stdlib + numpy + llama_cpp), not in the project's environment.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Lock
from typing import Any

import numpy as np
from llama_cpp import Llama


class Scorer:
    def __init__(self, model_path: str, n_ctx: int) -> None:
        self.llm = Llama(model_path=model_path, n_ctx=n_ctx, logits_all=True, verbose=False)
        self.lock = Lock()  # one context: requests are served one at a time

    def score(self, text: str) -> dict[str, Any]:
        llm = self.llm
        with self.lock:
            tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
            if len(tokens) > llm.n_ctx():
                raise ValueError(f"prompt of {len(tokens)} tokens exceeds the context of {llm.n_ctx()}")
            cached = llm.input_ids[: llm.n_tokens].tolist()
            keep = 0
            for a, b in zip(cached, tokens, strict=False):
                if a != b:
                    break
                keep += 1
            keep = min(keep, len(tokens) - 1)  # evaluate at least one token
            llm.n_tokens = keep
            llm.eval(tokens[keep:])
            logits = np.asarray(llm.scores[: len(tokens) - 1], dtype=np.float64)  # row i predicts token i + 1
        top = logits.max(axis=1, keepdims=True)
        lse = (top + np.log(np.exp(logits - top).sum(axis=1, keepdims=True)))[:, 0]
        picked = logits[np.arange(len(tokens) - 1), tokens[1:]] - lse
        bos = llm.token_bos()
        pieces, offsets, values = [], [], []
        offset = 0
        for i, token in enumerate(tokens):
            if i == 0 and token == bos:
                continue
            piece = llm.detokenize([token]).decode("utf-8", errors="ignore")
            pieces.append(piece)
            offsets.append(offset)
            values.append(None if i == 0 else float(picked[i - 1]))
            offset += len(piece)
        if values:
            values[0] = None  # the OpenAI format's first token has no log-prob
        return {"tokens": pieces, "text_offset": offsets, "token_logprobs": values,
                "top_logprobs": [None if v is None else {p: v} for p, v in zip(pieces, values, strict=True)]}


def make_handler(scorer: Scorer, model_name: str, upstream: str | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, body: dict[str, Any] | bytes) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _forward(self, body: bytes | None) -> None:
            if upstream is None:
                self._send(404, {"error": {"message": "no --chat-upstream", "type": "invalid_request_error"}})
                return
            request = urllib.request.Request(upstream + self.path, data=body, method=self.command,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=600) as resp:
                    self._send(resp.status, resp.read())
            except urllib.error.HTTPError as exc:
                self._send(exc.code, exc.read())

        def do_GET(self) -> None:
            self._forward(None)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/v1/completions":
                self._forward(raw)
                return
            body = json.loads(raw or b"{}")
            prompt = str(body.get("prompt", ""))
            if not body.get("echo") or body.get("logprobs") is None:
                self._send(400, {"error": {"message": "this harness only serves echo + logprobs",
                                           "type": "invalid_request_error"}})
                return
            try:
                logprobs = scorer.score(prompt)
            except ValueError as exc:
                self._send(400, {"error": {"message": str(exc), "type": "invalid_request_error"}})
                return
            n = len(logprobs["tokens"])
            self._send(200, {
                "id": f"cmpl-{time.time_ns()}", "object": "text_completion", "created": int(time.time()),
                "model": model_name,
                "choices": [{"index": 0, "text": prompt, "logprobs": logprobs, "finish_reason": "length"}],
                "usage": {"prompt_tokens": n, "completion_tokens": 0, "total_tokens": n},
            })

    return Handler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="GGUF file")
    ap.add_argument("--model-alias", default="smollm2")
    ap.add_argument("--port", type=int, default=8766)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--chat-upstream", default=None, help="e.g. http://127.0.0.1:8765 (llama_cpp.server)")
    args = ap.parse_args()
    scorer = Scorer(args.model, args.n_ctx)
    server = ThreadingHTTPServer(
        ("127.0.0.1", args.port), make_handler(scorer, args.model_alias, args.chat_upstream)
    )
    print(f"serving prompt log-probs on http://127.0.0.1:{args.port}/v1", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
