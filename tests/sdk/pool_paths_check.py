"""The official SDKs' embeddings and rerank calls against a running relay, unchanged: openai's
`embeddings.create` (its default base64 encoding, floats, `dimensions`) and Cohere's `rerank`
(v2 `ClientV2`, v1 `Client` with `return_documents`), and Cohere's SDK reading the relay's
not-reranked answer (the documents in their order, no score) on a group whose only rerank
account is down and which asked for the passthrough.

Usage: python pool_paths_check.py RELAY_BASE_URL API_KEY DEGRADED_GROUP_KEY
Exits non-zero (with the failing check named) when any call does not do what it should.
"""

import sys

import cohere
import openai


def main() -> int:
    base, key, degraded_key = sys.argv[1], sys.argv[2], sys.argv[3]
    failures = []

    def check(name, fn):
        try:
            fn()
            print(f"ok   {name}")
        except Exception as error:  # noqa: BLE001 - report every failure by name
            failures.append(name)
            print(f"FAIL {name}: {type(error).__name__}: {error}")

    oai = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    documents = ["an unrelated text", "a rust pool of accounts", "pool party"]

    def embeddings_default_encoding():
        # The SDK asks for base64 and decodes it itself.
        answer = oai.embeddings.create(model="text-embedding-3-small", input=["hello", "world"])
        assert len(answer.data) == 2, answer
        assert len(answer.data[0].embedding) == 1536, len(answer.data[0].embedding)
        assert all(isinstance(x, float) for x in answer.data[0].embedding[:8])
        assert answer.usage.prompt_tokens > 0, answer.usage

    def embeddings_float_and_dimensions():
        answer = oai.embeddings.create(
            model="text-embedding-3-small", input="hello", encoding_format="float", dimensions=256
        )
        assert len(answer.data[0].embedding) == 256, len(answer.data[0].embedding)

    def rerank_v2():
        co = cohere.ClientV2(base_url=base, api_key=key)
        answer = co.rerank(model="rerank-v3.5", query="rust pool", documents=documents, top_n=2)
        assert [r.index for r in answer.results][0] == 1, answer
        assert len(answer.results) == 2, answer
        assert all(0.0 <= r.relevance_score <= 1.0 for r in answer.results), answer

    def rerank_v1_with_documents():
        co = cohere.Client(base_url=base, api_key=key)
        answer = co.rerank(
            model="rerank-v3.5", query="pool", documents=["pool"], return_documents=True
        )
        assert answer.results[0].document.text == "pool", answer

    def rerank_degraded_is_read_by_the_sdk():
        co = cohere.ClientV2(base_url=base, api_key=degraded_key)
        answer = co.rerank(model="rerank-v3.5", query="rust pool", documents=documents, top_n=2)
        assert [r.index for r in answer.results] == [0, 1], answer
        assert all(r.relevance_score is None for r in answer.results), answer

    def rerank_refusal_is_a_typed_error():
        # The degraded group's key, asking for the error instead: Cohere's 429, typed by the SDK.
        co = cohere.ClientV2(base_url=base, api_key=degraded_key)
        try:
            co.rerank(
                model="rerank-v3.5",
                query="q",
                documents=["d"],
                request_options={
                    "additional_headers": {"x-poolgate-rerank-fallback": "error"},
                    "max_retries": 0,
                },
            )
        except cohere.errors.TooManyRequestsError as error:
            assert error.status_code == 429
            return
        raise AssertionError("the refusal was not raised")

    check("openai embeddings.create (base64 default)", embeddings_default_encoding)
    check("openai embeddings.create (float, dimensions)", embeddings_float_and_dimensions)
    check("cohere ClientV2.rerank", rerank_v2)
    check("cohere Client.rerank (v1, return_documents)", rerank_v1_with_documents)
    check("cohere rerank, not reranked (passthrough)", rerank_degraded_is_read_by_the_sdk)
    check("cohere rerank refusal (TooManyRequestsError)", rerank_refusal_is_a_typed_error)
    total = 6
    print(f"{total - len(failures)} checks passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
