"""The official Python SDKs against a running relay, unchanged: streaming and non-streaming.

Usage: python sdk_check.py RELAY_BASE_URL API_KEY
Exits non-zero (with the failing check named) when any call does not succeed.
"""

import sys

import anthropic
import openai


def main() -> int:
    base, key = sys.argv[1], sys.argv[2]
    failures = []

    def check(name, fn):
        try:
            fn()
            print(f"ok   {name}")
        except Exception as error:  # noqa: BLE001 - report every failure by name
            failures.append(name)
            print(f"FAIL {name}: {type(error).__name__}: {error}")

    claude = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    oai = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)

    def anthropic_create():
        message = claude.messages.create(
            model="claude-x", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        )
        assert message.content[0].text, message
        assert message.usage.output_tokens > 0, message.usage

    def anthropic_stream():
        with claude.messages.stream(
            model="claude-x", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert text, "no text streamed"
        assert final.usage.output_tokens > 0, final.usage

    def anthropic_bad_key():
        bad = anthropic.Anthropic(base_url=base, api_key="wrong-key", max_retries=0)
        try:
            bad.messages.create(model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        except anthropic.AuthenticationError as error:
            assert error.status_code == 401
            return
        raise AssertionError("a wrong key was accepted")

    def openai_chat():
        completion = oai.chat.completions.create(
            model="gpt-x", messages=[{"role": "user", "content": "hi"}]
        )
        assert completion.choices[0].message.content, completion

    def openai_chat_stream():
        chunks = oai.chat.completions.create(
            model="gpt-x", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text, "no text streamed"

    def openai_responses():
        response = oai.responses.create(model="gpt-x", input="hi")
        assert response.output_text, response
        follow = oai.responses.create(model="gpt-x", input="more", previous_response_id=response.id)
        assert follow.output_text, follow

    def openai_responses_stream():
        events = [e.type for e in oai.responses.create(model="gpt-x", input="hi", stream=True)]
        assert "response.completed" in events, events

    check("anthropic messages.create", anthropic_create)
    check("anthropic messages.stream", anthropic_stream)
    check("anthropic wrong key is a 401 AuthenticationError", anthropic_bad_key)
    check("openai chat.completions.create", openai_chat)
    check("openai chat.completions.create(stream=True)", openai_chat_stream)
    check("openai responses.create (+ previous_response_id)", openai_responses)
    check("openai responses.create(stream=True)", openai_responses_stream)
    print(f"{7 - len(failures)} checks passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
