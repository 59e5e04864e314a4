"""LOG_FORMAT=json: every record is one line holding one JSON object (kernel/logs.py)."""

from __future__ import annotations

import json
import logging
import sys

from django.test import RequestFactory

from kernel.logs import JsonFormatter
from portal.celery import app
from tests.test_settings import run


def record(msg: str = "hello", *args: object, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord("reservations.services", logging.WARNING, __file__, 1, msg, args, None)
    made.__dict__.update(extra)
    return made


def test_a_record_is_one_line_of_json_with_time_level_logger_and_message():
    line = JsonFormatter().format(record("booked %s GPUs\nfor %s", 2, "alice", gpu_ids=[1, 2]))
    assert "\n" not in line
    data = json.loads(line)
    assert data["level"] == "WARNING"
    assert data["logger"] == "reservations.services"
    assert data["message"] == "booked 2 GPUs\nfor alice"
    assert data["time"].endswith("+00:00")
    assert data["gpu_ids"] == [1, 2]  # extra= keys are kept


def test_a_traceback_stays_on_the_same_line():
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        failed = record("it failed")
        failed.exc_info = sys.exc_info()
    line = JsonFormatter().format(failed)
    assert "\n" not in line
    assert "ValueError: bad" in json.loads(line)["exc_info"]


def test_a_request_record_names_the_method_path_and_status():
    request = RequestFactory().post("/api/v1/reservations/")
    data = json.loads(JsonFormatter().format(record("Conflict", request=request, status_code=409)))
    assert (data["method"], data["path"], data["status_code"]) == ("POST", "/api/v1/reservations/", 409)
    assert "request" not in data


@app.task(name="tests.log_inside_a_task")
def log_inside_a_task() -> str:
    return JsonFormatter().format(record("inside"))


def test_a_record_inside_a_celery_task_names_the_task():
    data = json.loads(log_inside_a_task.apply(task_id="t-123").get())
    assert data["task_id"] == "t-123"
    assert data["task_name"] == "tests.log_inside_a_task"
    assert "task_id" not in json.loads(JsonFormatter().format(record("outside")))


def test_log_format_json_makes_the_portal_write_json_lines(tmp_path):
    code = "import django, logging; django.setup(); logging.getLogger('portal.x').warning('two\\nlines')"
    done = run(["-c", code], tmp_path, LOG_FORMAT="json")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["message"] == "two\nlines"


def test_the_default_stays_plain_and_a_wrong_format_is_refused(tmp_path):
    code = "import django, logging; django.setup(); logging.getLogger('portal.x').warning('hi')"
    plain = run(["-c", code], tmp_path)
    assert plain.stderr.strip().endswith("WARNING portal.x hi")
    wrong = run(["-c", code], tmp_path, LOG_FORMAT="xml")
    assert "LOG_FORMAT='xml': use plain or json." in wrong.stderr


def test_a_request_records_path_never_holds_a_feed_secret():
    request = RequestFactory().get("/feeds/17.n3.Zk3qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq.ics")
    data = json.loads(JsonFormatter().format(record("Not Found", request=request, status_code=404)))
    assert data["path"] == "/feeds/17.n3.[redacted].ics"


def test_with_debug_on_a_request_line_is_written_once_and_redacted(tmp_path):
    # Django's default "django" handlers (a console one under DEBUG) would write a second, unfiltered line.
    code = (
        "import django, logging; django.setup(); "
        "logging.getLogger('django.request').warning('Not Found: %s', '/feeds/1.mine.secretsecret.ics')"
    )
    done = run(["-c", code], tmp_path, DEBUG="1")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "Not Found" in line]
    assert len(lines) == 1
    assert lines[0].endswith("WARNING django.request Not Found: /feeds/1.mine.[redacted].ics")
