"""The admin-kept list of environments a booking may launch (environments.Environment, issue 22): a container
needs a well-formed image, a plain command none, and either's command is an argument list the agent would run
(gpubook_agent.protocol.argv_problem): what is not is refused with words, in the model and in Django admin."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from environments.models import Environment

PYTORCH = {
    "name": "PyTorch 2.5",
    "image": "registry.example.org/lab/pytorch:2.5-cuda12.4",
    "command": ["jupyter", "lab"],
}


def environment(**fields) -> Environment:
    return Environment(**{**PYTORCH, **fields})


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"image": "pytorch"},
        {"image": "localhost:5000/lab/tf_2.15@sha256:" + "a" * 64},
        {"kind": Environment.Kind.COMMAND, "image": "", "command": ["/usr/bin/python3", "-m", "http.server"]},
    ],
)
def test_well_formed_environments_are_kept(db, fields):
    environment(**fields).full_clean()


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"image": ""}, "image", "Give the container's image"),
        ({"image": "Registry.example.org/Lab/PyTorch"}, "image", "lower case path"),
        ({"image": "lab/pytorch:2.5; rm -rf /"}, "image", "Give the container's image"),
        ({"kind": Environment.Kind.COMMAND}, "image", "A plain command runs no image"),
        ({"command": "jupyter lab"}, "command", "a list of 1 to 64 arguments"),  # a shell line
        ({"command": []}, "command", "a list of 1 to 64 arguments"),
        ({"command": ["jupyter", ""]}, "command", "text of 1 to 4096 characters"),
        ({"command": ["jupyter", "a\0b"]}, "command", "without NUL"),
        ({"command": ["x"] * 65}, "command", "a list of 1 to 64 arguments"),
        ({"command": ["jupyter", 5]}, "command", "text of 1 to 4096 characters"),
        ({"memory_max_gb": 0}, "memory_max_gb", "greater than or equal to 1"),
    ],
)
def test_what_the_nodes_would_not_run_is_refused_with_words(db, fields, field, words):
    with pytest.raises(ValidationError) as refused:
        environment(**fields).full_clean()
    assert words in " ".join(refused.value.message_dict[field])


def test_admins_list_and_add_them_and_a_shell_line_is_refused_in_the_form(carol, alice):
    client = Client()
    client.force_login(carol)
    form = {"name": "TF", "kind": "container", "image": "lab/tf:2.15", "memory_max_gb": "64", "enabled": "on"}

    refused = client.post("/admin/environments/environment/add/", {**form, "command": '"python train.py"'})
    assert refused.status_code == 200 and "Not a command the nodes run" in refused.content.decode()
    added = client.post("/admin/environments/environment/add/", {**form, "command": '["python", "train.py"]'})
    assert added.status_code == 302
    assert Environment.objects.get().command == ["python", "train.py"]
    assert "lab/tf:2.15" in client.get("/admin/environments/environment/").content.decode()

    researcher = Client()
    researcher.force_login(alice)
    assert researcher.get("/admin/environments/environment/").status_code == 302  # to the admin login
