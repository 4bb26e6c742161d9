"""The optional LLM judge against a fake OpenAI-compatible server on 127.0.0.1 (no network)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from memlab.errors import MemlabError
from memlab.app.eval import judge


class _Fake(BaseHTTPRequestHandler):
    seen: list = []
    reply = '{"grammar": 8, "creativity": 6, "consistency": 7, "plot": 5}'

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        content = type(self).reply
        if "STORY-B" in body["messages"][0]["content"]:
            content = 'Sure! {"grammar": 4, "creativity": 2, "consistency": 3, "plot": 1}'
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture()
def server():
    srv = HTTPServer(("127.0.0.1", 0), _Fake)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    _Fake.seen = []
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()


def test_judge_scores_are_averaged(server, monkeypatch):
    monkeypatch.setenv("MEMLAB_JUDGE_API_KEY", "test-key")
    res = judge.judge_texts(["Once upon a time.", "STORY-B begins."], ["She smiled.", "He left."], server, "judge-model")
    assert res == {"judge_grammar": 6.0, "judge_creativity": 4.0, "judge_consistency": 5.0, "judge_plot": 3.0}
    assert len(_Fake.seen) == 2
    req = _Fake.seen[0]
    assert req["path"] == "/v1/chat/completions" and req["body"]["model"] == "judge-model"
    assert req["auth"] == "Bearer test-key"
    assert "Once upon a time." in req["body"]["messages"][0]["content"]


def test_judge_bad_replies(server):
    with pytest.raises(MemlabError, match="no JSON"):
        judge.parse_scores("great story")
    with pytest.raises(MemlabError, match="lacks 'plot'"):
        judge.parse_scores('{"grammar": 1, "creativity": 1, "consistency": 1}')
    with pytest.raises(MemlabError, match="outside 0-10"):
        judge.parse_scores('{"grammar": 11, "creativity": 1, "consistency": 1, "plot": 1}')
    with pytest.raises(MemlabError, match="failed"):
        judge.ask("http://127.0.0.1:9/v1", "m", "x", timeout=2)


class _Echo:
    name, max_context = "echo", 1000

    def count_tokens(self, t):
        return len(t.split())

    def generate(self, prompts, n):
        return ["The rain stopped. Then the sun came out." for _ in prompts]


def test_judge_is_off_by_default(monkeypatch):
    """Default options send nothing anywhere: the judge is never called and no judge scores appear."""
    from memlab.app.eval.tasks import TaskOptions, get_task

    def called(*a, **kw):
        raise AssertionError("the judge was called without --judge-url")

    monkeypatch.setattr(judge, "judge_texts", called)
    monkeypatch.setattr(judge, "ask", called)
    task = get_task("next_sentence")
    opts = TaskOptions(limit=2)
    res = task.evaluate(_Echo(), task.load(opts), opts)
    assert res["n"] == 2 and not [k for k in res if k.startswith("judge_")]


def test_next_sentence_task_calls_the_judge(server):
    from memlab.app.eval.tasks import TaskOptions, get_task

    task = get_task("next_sentence")
    opts = TaskOptions(limit=2, judge_url=server, judge_model="m")
    res = task.evaluate(_Echo(), task.load(opts), opts)
    assert res["judge_grammar"] == 8.0 and res["judge_plot"] == 5.0 and len(_Fake.seen) == 2
    assert res["first_rouge_l"] >= 0 and res["n"] == 2
