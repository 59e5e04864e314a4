from __future__ import annotations

import factory
from django.contrib.auth import get_user_model

from nodes.models import Gpu, Node


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    unix_username = factory.LazyAttribute(lambda o: o.username)
    email = factory.LazyAttribute(lambda o: f"{o.username}@lab.example")
    password = factory.django.Password("correct horse battery staple")


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node

    name = factory.Sequence(lambda n: f"node-{n}")
    hostname = factory.LazyAttribute(lambda o: f"{o.name}.lab.example")


class GpuFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Gpu

    node = factory.SubFactory(NodeFactory)
    index = factory.Sequence(lambda n: n)
    uuid = factory.Sequence(lambda n: f"GPU-{n:08x}-0000-0000-0000-000000000000")
    model = "NVIDIA A100-SXM4-80GB"
    memory_mib = 81920


def node_with_gpus(count: int = 4, **node_fields: object) -> Node:
    node = NodeFactory(**node_fields)
    for index in range(count):
        GpuFactory(node=node, index=index)
    return node
