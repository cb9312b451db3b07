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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from tests.llm_fixtures import send_body


class MiniLMServer:
    def __init__(self, key: str | None = None) -> None:
        from sentence_transformers import SentenceTransformer

        from rag_experiments.stages.embedding import minilm_path

        self.model = SentenceTransformer(str(minilm_path()), device="cpu")
        self.key, self.swap, self.nan, self.fault = key, False, False, ""
        self.requests, self.inputs = 0, 0
        self._lock = threading.Lock()
        srv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                with srv._lock:
                    srv.requests += 1
                    odd = srv.requests % 2 == 1
                if srv.fault == "echo_key":
                    return send_body(self, 500, json.dumps({"error": self.headers.get("Authorization")}).encode())
                if srv.fault == "500" and odd:
                    return send_body(self, 500, b'{"error": {"message": "overloaded"}}')
                if srv.fault == "429" and odd:
                    self.send_response(429)
                    self.send_header("Retry-After", "1")
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
                    return
                if srv.key and self.headers.get("Authorization") != f"Bearer {srv.key}":
                    return send_body(self, 401, b'{"error": {"message": "invalid api key"}}')
                if self.path.rstrip("/") != "/v1/embeddings" or body.get("model") != "all-MiniLM-L6-v2":
                    return send_body(self, 404, b'{"error": {"message": "model not found"}}')
                texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
                vecs = srv.model.encode(texts, batch_size=64, convert_to_numpy=True, normalize_embeddings=True)
                vecs = vecs[:, ::-1] if srv.swap else vecs
                if srv.nan:
                    vecs = vecs.copy()
                    vecs[0, 0] = np.nan
                tokens = sum(len(srv.model.tokenizer(t)["input_ids"]) for t in texts)
                with srv._lock:
                    srv.inputs += len(texts)
                data = [{"object": "embedding", "index": i, "embedding": [float(x) for x in v]} for i, v in enumerate(vecs)]
                out = {"object": "list", "model": body["model"], "data": data,
                       "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}  # fmt: skip
                send_body(self, 200, json.dumps(out, allow_nan=True).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


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
