"""Compare raysize's minimal protos with Ray's: every message, field, enum value, service
and method we define must exist in Ray with the same number, name, type, label, type
name, `optional` presence and oneof. Fields Ray has and we leave out are fine."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from google.protobuf import descriptor_pb2 as d

Message = d.DescriptorProto


def _messages(prefix: str, messages: Iterable[Message]) -> Iterator[tuple[str, Message]]:
    for m in messages:
        name = f"{prefix}.{m.name}"
        yield name, m
        yield from _messages(name, m.nested_type)


def _enums(prefix: str, f: d.FileDescriptorProto) -> Iterator[tuple[str, d.EnumDescriptorProto]]:
    for e in f.enum_type:
        yield f"{prefix}.{e.name}", e
    for name, m in _messages(prefix, f.message_type):
        for e in m.enum_type:
            yield f"{name}.{e.name}", e


class Index:
    def __init__(self, files: Iterable[d.FileDescriptorProto]) -> None:
        self.messages: dict[str, Message] = {}
        self.enums: dict[str, d.EnumDescriptorProto] = {}
        self.services: dict[str, d.ServiceDescriptorProto] = {}
        for f in files:
            prefix = "." + f.package
            self.messages.update(_messages(prefix, f.message_type))
            self.enums.update(_enums(prefix, f))
            self.services.update((f"{prefix}.{s.name}", s) for s in f.service)


def _oneof(m: Message, field: d.FieldDescriptorProto) -> str | None:
    return m.oneof_decl[field.oneof_index].name if field.HasField("oneof_index") else None


def compare(
    ours: Iterable[d.FileDescriptorProto], ray: Iterable[d.FileDescriptorProto]
) -> list[str]:
    """Every difference, as readable lines; empty when ours is a faithful subset of Ray's."""
    mine, theirs = Index(ours), Index(ray)
    problems: list[str] = []
    for name, m in mine.messages.items():
        other = theirs.messages.get(name)
        if other is None:
            problems.append(f"message {name}: not in Ray")
            continue
        if m.options.map_entry != other.options.map_entry:
            problems.append(f"message {name}: map entry {m.options.map_entry} in ours")
        by_number = {f.number: f for f in other.field}
        for f in m.field:
            g = by_number.get(f.number)
            where = f"field {name}.{f.name} (#{f.number})"
            if g is None:
                problems.append(f"{where}: Ray has no field #{f.number}")
                continue
            for attr in ("name", "type", "label", "type_name", "proto3_optional"):
                a, b = getattr(f, attr), getattr(g, attr)
                if a != b:
                    problems.append(f"{where}: {attr} is {a!r}, Ray has {b!r}")
            if _oneof(m, f) != _oneof(other, g):
                problems.append(f"{where}: oneof {_oneof(m, f)!r}, Ray has {_oneof(other, g)!r}")
    for name, e in mine.enums.items():
        other_enum = theirs.enums.get(name)
        if other_enum is None:
            problems.append(f"enum {name}: not in Ray")
            continue
        values = {v.name: v.number for v in other_enum.value}
        for v in e.value:
            if values.get(v.name) != v.number:
                problems.append(f"enum {name}.{v.name} = {v.number}: Ray has {values.get(v.name)}")
    for name, s in mine.services.items():
        other_service = theirs.services.get(name)
        if other_service is None:
            problems.append(f"service {name}: not in Ray")
            continue
        methods = {x.name: x for x in other_service.method}
        for method in s.method:
            theirs_method = methods.get(method.name)
            if theirs_method is None:
                problems.append(f"method {name}.{method.name}: not in Ray")
                continue
            for attr in ("input_type", "output_type", "client_streaming", "server_streaming"):
                a, b = getattr(method, attr), getattr(theirs_method, attr)
                if a != b:
                    problems.append(f"method {name}.{method.name}: {attr} {a!r}, Ray has {b!r}")
    return problems
