"""All configuration in one object: env vars (``CASCADE_*``) and ``cascade serve`` CLI flags.

One pydantic-settings class keeps defaults, validation and documentation in a single place; the
README's configuration table is generated from the same fields (``cascade config-table``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parents[2]
EMBEDDED_MODEL = Path("models") / "pycoder-23m"
# A checkout (editable install) finds the embedded model beside the sources; an installed package
# looks in the working directory (the images' WORKDIR holds models/).
DEFAULT_MODEL = REPO_ROOT / EMBEDDED_MODEL if (REPO_ROOT / EMBEDDED_MODEL).is_dir() else Path.cwd() / EMBEDDED_MODEL


class Settings(BaseSettings):
    """Cascade's configuration. Every field is ``CASCADE_<NAME>`` in the environment and
    ``--<name>`` (kebab case) on ``cascade serve``."""

    model_config = SettingsConfigDict(env_prefix="CASCADE_", extra="ignore", protected_namespaces=())

    # engine
    model: str = Field(str(DEFAULT_MODEL), description="Model path, Hugging Face id, or a registry name "
                       "(`cascade models list`; fetched on first use).")
    served_model_name: str | None = Field(None, description="Name clients send as `model`; default: basename.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "float32", description="Weights/activation dtype of the vLLM engines (the codec's exact path is integer)."
    )
    max_model_len: int = Field(1024, ge=16, description="Context length (prompt + completion tokens).")
    memory_fraction: float = Field(
        0.12, gt=0.0, le=0.98, description="vLLM gpu_memory_utilization of the main engine (CPU memory on CPU)."
    )
    kv_cache_mib: int | None = Field(
        None, ge=16, description="KV cache of the main and prediction engines, in MiB; overrides the memory "
        "fractions. Default: the fractions on a GPU, 512 MiB on the CPU (where vLLM reads the fraction off "
        "the NUMA node's total, which differs between machines of the same size)."
    )
    enforce_eager: bool = Field(True, description="Disable torch.compile/CUDA graphs (fast start).")
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM tensor parallelism for large models.")
    engine_seed: int = Field(0, description="Engine-level seed.")
    max_num_seqs: int = Field(64, ge=1, description="Max sequences the engine batches per step.")
    # predicted outputs
    enable_predictions: bool = Field(
        True, description="Run a second engine with the static-text proposer for `prediction` requests."
    )
    num_speculative_tokens: int = Field(
        64, ge=1, le=64, description="Largest draft per step (K); each request drafts up to K, adaptively."
    )
    predict_memory_fraction: float | None = Field(
        None, gt=0.0, le=0.98, description="Memory fraction of the prediction engine (default: memory_fraction)."
    )
    max_prediction_tokens: int = Field(4096, ge=1, description="Largest prediction, in tokens.")
    stored_responses_bytes: int = Field(
        64 << 20, ge=0, description="Bytes of Responses API responses (each with its whole conversation) "
        "kept in memory for `previous_response_id` and `GET /v1/responses/{id}` (the oldest dropped first; 0: "
        "none kept)."
    )
    prediction_draft_crowding: float = Field(
        0.5, ge=0.0, le=8.0, description="Share by which each other request in an engine step raises the evidence "
        "a drafted prediction token needs (0.5: eight requests need 4.5×; on a CPU a drafted token costs the whole "
        "step ~1 ms). 0: draft as for a lone request (a GPU, where a verified token costs a step little)."
    )
    prediction_datastore_mib: int = Field(
        32, ge=0, le=1024, description="MiB of this Python environment's own sources (standard library and installed "
        "packages) the prediction engine drafts new code from, tokenised by the served model's tokenizer once "
        "(~25 s for 32 MiB, then memory-mapped from the cache directory); 0: off."
    )
    prediction_datastore_dir: str | None = Field(
        None, description="Where built code datastores are kept (default: $CASCADE_HOME/datastores, that is "
        "~/.cascade/datastores)."
    )
    prediction_response_cache_tokens: int = Field(
        32768, ge=0, description="Tokens of earlier responses to `prediction` requests kept by the prediction engine "
        "as a draft source, over all `user` scopes (each `user` drafts from its own; ~1.5 KB of memory a token; 0: "
        "off, speed then reveals nothing across requests)."
    )
    # codec
    enable_codec: bool = Field(True, description="Serve the exact codec (/compress, /decompress).")
    codec_max_rows: int = Field(
        32, ge=1, le=1024, description="Lanes the exact codec decodes together (KV-cache rows; a segment's lanes "
        "always decode together even if they are more). Memory: rows × positions × 24 KiB for the default model."
    )
    codec_prefill_tokens: int = Field(1024, ge=64, description="Tokens per compression chunk (one batched prefill; "
                                      "one chunk runs between two decode steps; smaller: finer interleaving).")
    codec_kv_budget_mib: int = Field(
        2048, ge=1, description="Decode KV-cache budget of the exact codec: a segment joins the running rows only "
        "while rows × positions × bytes per position fit; one that never fits is refused (400)."
    )
    codec_max_draft: int = Field(
        16, ge=0, le=64, description="Speculative exact decoding: the longest draft (tokens guessed from the context "
        "and the decoded text) a lane verifies in one pass; decoded bytes and containers are the same for any value "
        "(0: one token per step).")
    codec_interleave_tokens: int = Field(
        16, ge=1, description="Wall-clock fairness: while the exact codec decodes, compression prefill runs on a "
        "credit of this many tokens per row of each decode step (over steps that fed R rows at most R × this + "
        "codec_prefill_tokens + one chunk of prefill sits between them); without decoding, chunks run back to back.")
    codec_threads: int = Field(0, ge=0, description="Threads of the codec's matrix products (0: torch's default).")
    codec_device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the exact codec computes. auto: the engines' device if it passes the codec's "
        "start-up known answer (computes the CPU's integers), else the CPU; cuda: the GPU, and the codec is off "
        "with the reason if it fails the check.")
    codec_cuda_graphs: bool = Field(
        True, description="On a GPU, replay the exact codec's decode passes as CUDA graphs (one launch a pass "
        "instead of ~1,500; the same integers). Off: every kernel launched from Python.")
    codec_kernels: Literal["fast", "reference"] = Field(
        "fast", description="Kernels of the exact codec: fast = the host's int8 GEMM where load-time probes find "
        "it exact and faster than float32 GEMMs, products of up to 4 rows streamed over the int8 weights, decode "
        "attention reading the integer KV cache directly and the elementwise chains compiled into one loop each "
        "(CPU); reference = float32 GEMMs, float64 bmm and torch ops (the first release's). Both compute the same "
        "integers.")
    codec_segments_in_flight: int = Field(8, ge=1, description="Segments of one request coded concurrently.")
    codec_container_version: Literal[3, 4] = Field(
        4, description="Container format /compress writes: 4 codes a token outside the top-k under the model's "
        "weights (smaller); 3 is what releases before it read — for a rolling upgrade, until every replica that "
        "may open the containers reads version 4. Both versions are always read.")
    codec_top_k: int = Field(1024, ge=1, le=1024, description="Default top-k of the codec distribution.")
    codec_precision_bits: Literal[16, 24, 32] = Field(32, description="Default coder precision.")
    codec_lane_tokens: int = Field(
        1000, ge=16, description="Default lane length in tokens: each lane is one context window (capped by "
        "max_model_len minus the context)."
    )
    codec_lanes: int = Field(16, ge=1, le=64, description="Default lanes per segment (decoded in parallel).")
    codec_lane_steps: int = Field(
        768, ge=0, description="Lane plan for latency: an input that fits one default segment gets lanes of this "
        "many tokens (never shorter: the longest lane sets its sequential decode steps, shorter lanes cost bits), "
        "adding up to codec_lane_extra lanes to get within it; 0, or a request's lane_tokens/lanes: as given.")
    codec_lane_extra: int = Field(
        0, ge=0, le=64, description="Lanes the lane plan may add to a small input's default lane count (each costs "
        "bits — SmolLM2, 4 KB of code, 2 → 3 lanes: +6.2 %; benchmarks/RESULTS.md, 'Lane plan').")
    codec_max_input_bytes: int = Field(64 * 1024 * 1024, ge=1, description="Largest /compress input.")
    codec_max_output_bytes: int = Field(1 << 30, ge=1, description="Largest total output a container may declare.")
    codec_max_segments: int = Field(1 << 20, ge=1, description="Largest segment count in a container.")
    codec_max_context_bytes: int = Field(65536, ge=0, description="Largest /compress context (and container "
                                         "header context on /decompress).")
    codec_selftest: bool = Field(True, description="Round-trip a sample through the exact codec at startup.")
    codec_selftest_fault: bool = Field(False, description="Testing only: corrupt the self-test on purpose.")
    # k-CBS
    max_kcbs_steps: int = Field(256, ge=1, description="Largest k-CBS suffix length T.")
    max_kcbs_candidates: int = Field(1024, ge=1, description="Largest k² (candidates per k-CBS step).")
    # server
    host: str = Field("127.0.0.1", description="Bind address.")
    port: int = Field(8000, ge=0, le=65535, description="Bind port.")
    api_key: SecretStr | None = Field(None, description="If set, every route but /health needs this Bearer key.")
    cors_origins: list[str] = Field(default_factory=list, description="Allowed CORS origins (off when empty).")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    log_json: bool = Field(True, description="Structured JSON log lines.")
    watchdog_seconds: float = Field(2.0, gt=0, description="How often engine liveness is checked.")
    engine_stall_seconds: float | None = Field(
        120.0, gt=0, description="An engine that answers no state query for this long is hung: the service "
        "exits 1 like on an engine death. Off when empty (or `null`)."
    )
    drain_seconds: float = Field(30.0, ge=0, description="On SIGTERM, wait this long for in-flight requests.")
    # limits
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="Largest request body accepted.")
    max_tokens_limit: int = Field(4096, ge=1, description="Largest max_tokens a request may ask for.")
    max_n: int = Field(8, ge=1, description="Largest `n` (choices per request).")
    max_prompts: int = Field(64, ge=1, description="Most prompts in one /v1/completions request.")
    max_concurrent_requests: int = Field(256, ge=1, description="In-flight requests before 429.")
    max_stop_sequences: int = Field(8, ge=0, description="Largest number of stop strings.")
    max_stop_token_ids: int = Field(64, ge=0, description="Largest number of stop_token_ids.")
    max_top_logprobs: int = Field(20, ge=0, description="Largest top_logprobs / logprobs.")
    max_export_top_k: int = Field(1024, ge=1, le=65536, description="Largest compression_top_k of a top-k export.")
    max_export_values: int = Field(
        1 << 21, ge=1, description="Largest positions × compression_top_k of one export request (its response "
        "size and engine work grow with it)."
    )
    max_kcbs_rows: int = Field(
        2048, ge=1, description="Largest beam_width × steps of one k-CBS search (the engine rows it evaluates)."
    )
    max_bad_words: int = Field(64, ge=0, description="Largest number of bad_words.")
    max_grammar_bytes: int = Field(
        131072, ge=1024, description="Largest output constraint the engine compiles, in bytes: a JSON schema "
        "and the grammar compiled from it (response_format, structured_outputs.json), a grammar, a regex, or the "
        "choices together. The engine's compile time and memory grow faster than the size (a 176 KB grammar took "
        "3 s, a 7 MB one exhausted 20 GB and killed the engine)."
    )
    max_schema_depth: int = Field(
        64, ge=2, description="Deepest nesting of objects and arrays in a JSON schema to constrain output with "
        "(response_format, structured_outputs.json): its grammar is compiled per request, in time that grows with "
        "the cube of the depth."
    )
    max_word_chars: int = Field(256, ge=1, description="Longest stop string or bad word, in characters.")
    max_tokenize_chars: int = Field(
        1 << 20, ge=1, description="Longest /v1/tokenize text in characters, and most /v1/detokenize ids "
        "(the tokenizer runs in the gateway)."
    )
    max_header_bytes: int = Field(65536, ge=1024, description="Largest total size of a request's headers (431).")
    max_headers: int = Field(100, ge=8, description="Most header lines a request may send (431).")
    header_timeout_seconds: float = Field(10.0, gt=0, description="Time a client has to send a request's "
                                          "headers (408, connection closed).")
    body_timeout_seconds: float = Field(
        60.0, gt=0, description="Total time a request may spend waiting for its body to arrive (408), plus one "
        "second per body_min_rate_bytes received. Slow senders hold an admission slot while they trickle. A "
        "/compress reply already under way cannot change its status: it ends without its trailer (refused as "
        "truncated) or, over SSE, with a 408 error event."
    )
    body_min_rate_bytes: int = Field(16384, ge=1, description="Upload rate (bytes/s) that extends "
                                     "body_timeout_seconds, so large uploads over slow links still complete.")
    request_timeout_seconds: float | None = Field(
        600.0, gt=0, description="Deadline of a /v1 request, body to last byte (504; a stream ends with an error "
        "event). Off when empty (or `null`)."
    )

    @field_validator("served_model_name", "kv_cache_mib", "predict_memory_fraction", "api_key",
                     "engine_stall_seconds", "request_timeout_seconds", mode="before")
    @classmethod
    def _empty_means_unset(cls, value: object) -> object:
        """An optional setting given as an empty string, ``null`` or ``none`` is switched off: an environment
        variable cannot hold a JSON null, and ``CASCADE_REQUEST_TIMEOUT_SECONDS=`` is how a compose file or
        a shell says "none"."""
        if isinstance(value, str) and value.strip().lower() in ("", "null", "none"):
            return None
        return value

    @model_validator(mode="after")
    def _default_served_name(self) -> Settings:
        if not self.served_model_name:
            self.served_model_name = Path(self.model.rstrip("/")).name
        return self

    @property
    def codec_max_container_bytes(self) -> int:
        """The largest container ``/decompress`` reads: the largest input stored raw, plus the framing a
        container may add (≤ 10 bytes a segment of at least one byte, the header with its context, the
        trailer), so every container this service writes opens here again."""
        segments = min(self.codec_max_segments, self.codec_max_input_bytes)
        return self.codec_max_input_bytes + 10 * segments + self.codec_max_context_bytes + 1024

    @property
    def route_body_limits(self) -> dict[str, int]:
        """Body limits that differ from ``max_body_bytes``, by route prefix. A JSON ``/decompress`` body
        (base64) holds a container of up to 3/4 of its limit: larger containers go as raw bytes."""
        return {"/compress": self.codec_max_input_bytes, "/decompress": self.codec_max_container_bytes}

    @property
    def model_name(self) -> str:
        """The public model name (always set after validation)."""
        return self.served_model_name or Path(self.model).name


def load_settings(argv: list[str] | None = None) -> Settings:
    """Settings from env, overridden by CLI flags when ``argv`` is given."""
    if argv is None:
        return Settings()
    return Settings(_cli_parse_args=argv, _cli_kebab_case=True, _cli_prog_name="cascade serve",
                    _cli_implicit_flags=True)


# Every dimension a request can inflate: (setting, what it bounds, how a request over it is answered). Each is a
# ``Settings`` field (a test checks it), so code reads limits from ``Settings`` only and the README's limits
# table (``cascade config-table --limits``) comes from here.
LIMITS = [
    ("max_body_bytes", "request body of every route but the codec's", "413 `body_too_large`"),
    ("codec_max_input_bytes", "/compress body; a /decompress body may add the framing of a container of that "
     "input stored raw (+ 10 bytes a segment, the context, 1 KiB; in a JSON body, base64 takes 4/3 of it) (counted "
     "while streaming too)",
     "413 `body_too_large` / `input_too_large`"),
    ("max_model_len", "prompt tokens + max_tokens (k-CBS: prompt + steps)", "400 `context_length_exceeded`"),
    ("max_tokens_limit", "max_tokens / max_completion_tokens / codec.tokens",
     "400 naming the field sent (`max_tokens`, …)"),
    ("max_n", "`n` choices per request", "400, param `n`"),
    ("max_prompts", "prompts in one /v1/completions request", "400, param `prompt`"),
    ("max_stop_sequences", "stop strings", "400, param `stop`"),
    ("max_stop_token_ids", "stop_token_ids (vLLM's extension)", "400, param `stop_token_ids`"),
    ("max_top_logprobs", "logprobs / top_logprobs", "400, param `logprobs` / `top_logprobs` (chat)"),
    ("max_prediction_tokens", "prediction length in tokens (text checked before tokenising)",
     "400, param `prediction`"),
    ("max_kcbs_steps",
     "k-CBS T (steps); with a target, max_edit_distance ≤ T and the target ≤ T + max_edit_distance tokens; "
     "max_tokens of a use_beam_search request",
     "400, param `steps` / `max_edit_distance` / `target` / `max_tokens`"),
    ("max_kcbs_candidates", "k-CBS k² (candidates per step; k is also capped at 64)", "400, param `beam_width`"),
    ("codec_max_segments", "segments in a container", "400 `container_too_large`"),
    ("codec_max_output_bytes", "total original bytes a container declares", "400 `container_too_large`"),
    ("codec_max_context_bytes", "/compress context and a container's header context",
     "400 `context_too_large`, param `context` / `container_too_large`"),
    ("codec_lane_tokens", "default lane length (a request's lane_tokens ≥ 16, capped by the context)",
     "400, param `lane_tokens`"),
    ("codec_lanes", "default lanes per segment (a request's lanes, 1…64)", "400, param `lanes`"),
    ("codec_top_k", "default codec top-k (a request's top_k ≤ 1024 and < vocabulary)", "400, param `top_k`"),
    ("max_export_top_k", "top-k export's compression_top_k", "400"),
    ("max_export_values", "top-k export's positions × compression_top_k, summed over prompts",
     "400, param `compression_top_k`"),
    ("max_kcbs_rows", "k-CBS beam_width × steps (engine rows per search); n × max_tokens of a use_beam_search "
     "request", "400, param `steps` / `max_tokens`"),
    ("max_bad_words", "bad_words entries", "400, param `bad_words`"),
    ("max_grammar_bytes", "an output constraint: a JSON schema and its grammar, a grammar, a regex, the choices",
     "400, param naming the constraint"),
    ("max_schema_depth", "nesting of a JSON schema (response_format, structured_outputs.json)",
     "400, param naming the schema"),
    ("max_word_chars", "characters of one stop string or bad word", "400, param `stop` / `bad_words`"),
    ("max_tokenize_chars", "/v1/tokenize text (characters), /v1/detokenize tokens (ids)",
     "400, param `prompt` / `tokens`"),
    ("max_header_bytes", "total size of a request's headers", "431, connection closed"),
    ("max_headers", "header lines of a request", "431, connection closed"),
    ("header_timeout_seconds", "time to send the headers", "408, connection closed"),
    ("body_timeout_seconds", "total time spent waiting for the body", "408 `body_timeout` (a `/compress` reply "
     "already under way: cut short, see \"A stalled upload\")"),
    ("request_timeout_seconds", "a /v1 request from start to last byte", "504 `deadline_exceeded` (stream: "
     "error event with status 504)"),
    ("max_concurrent_requests", "requests in flight (/v1/*, /compress, /decompress)",
     "429 `overloaded` + `Retry-After`"),
]
