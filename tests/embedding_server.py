"""A real OpenAI-compatible ``/v1/embeddings`` server wrapping the packaged MiniLM
(sentence-transformers), and llama.cpp's own server in embedding mode on the packaged SmolLM2
GGUF: the two servers ``embedding=openai`` is tested against.

``MiniLMServer`` can require a key (``key``), serve another model under the same name
(``swap=True``: MiniLM's vectors with the components reversed, so a different model by content),
or answer NaN (``nan=True``). ``fault``: "" none; "500" every other request a 500; "429" every
other request a 429 with ``Retry-After: 1``; "echo_key" a 500 whose body repeats the request's
Authorization header. ``requests`` counts the POSTs and ``inputs`` the texts embedded.
"""

from __future__ import annotations

import json
import threading

import numpy as np

from tests.http_fakes import FakeHTTP, Reply, Request, embeddings


class MiniLMServer:
    """The packaged MiniLM behind ``/v1/embeddings``: a handler of ``tests.http_fakes.FakeHTTP``."""

    def __init__(self, key: str | None = None) -> None:
        from sentence_transformers import SentenceTransformer

        from rag_experiments.stages.embedding import minilm_path

        self.model = SentenceTransformer(str(minilm_path()), device="cpu")
        self.key, self.swap, self.nan, self.fault = key, False, False, ""
        self.requests, self.inputs = 0, 0
        self._lock = threading.Lock()
        self.http = FakeHTTP(self._reply)
        self.base_url = self.http.url

    def _reply(self, r: Request) -> Reply:
        with self._lock:
            self.requests += 1
            odd = self.requests % 2 == 1
        auth = r.headers.get("Authorization")
        if self.fault == "echo_key":
            return Reply(500, json.dumps({"error": auth}).encode())
        if self.fault == "500" and odd:
            return Reply(500, b'{"error": {"message": "overloaded"}}')
        if self.fault == "429" and odd:
            return Reply(429, b"{}", {"Retry-After": "1"})
        if self.key and auth != f"Bearer {self.key}":
            return Reply(401, b'{"error": {"message": "invalid api key"}}')
        body = r.body
        if r.path.rstrip("/") != "/v1/embeddings" or body.get("model") != "all-MiniLM-L6-v2":
            return Reply(404, b'{"error": {"message": "model not found"}}')
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        vecs = self.model.encode(texts, batch_size=64, convert_to_numpy=True, normalize_embeddings=True)
        vecs = vecs[:, ::-1] if self.swap else vecs
        if self.nan:
            vecs = vecs.copy()
            vecs[0, 0] = np.nan
        tokens = sum(len(self.model.tokenizer(t)["input_ids"]) for t in texts)
        with self._lock:
            self.inputs += len(texts)
        rows = iter(vecs)
        out = {"model": body["model"], **embeddings(texts, lambda _t: [float(x) for x in next(rows)])}
        out["usage"] = {"prompt_tokens": tokens, "total_tokens": tokens}
        return Reply(200, json.dumps(out, allow_nan=True).encode())

    def close(self) -> None:
        self.http.close()


def llama_embedding_server(model_path: str, n_threads: int = 1):
    """llama.cpp's server (``xllamacpp``) with ``/v1/embeddings`` on: (server, base URL).

    Mean pooling: a chat GGUF such as SmolLM2 declares no pooling type, and llama.cpp refuses
    ``/v1/embeddings`` with pooling "none" ("not OAI compatible")."""
    import xllamacpp

    p = xllamacpp.CommonParams()
    p.model.path = str(model_path)
    p.embedding = True
    p.pooling_type = xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
    p.n_parallel, p.n_ctx = 1, 2048
    p.cpuparams.n_threads = p.cpuparams_batch.n_threads = int(n_threads)
    p.hostnames, p.port, p.verbosity = ["127.0.0.1"], 0, -1
    server = xllamacpp.Server(p)
    return server, server.listening_address.rstrip("/") + "/v1"
