"""A Temporal that will not list the search attributes (an API key without operator rights)
does not make raysize claim they are missing: it says it cannot tell, and `raysize doctor`
warns instead of failing."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from raysize.worker.temporal import (
    SearchAttributesUnknown,
    SetupError,
    ensure_search_attributes,
)


class Operator:
    def __init__(self, refuse: bool) -> None:
        self.refuse = refuse

    async def list_search_attributes(self, req: Any) -> Any:
        if self.refuse:
            raise RPCError("Request unauthorized.", RPCStatusCode.PERMISSION_DENIED, b"")
        return type("Listed", (), {"custom_attributes": {}, "system_attributes": {}})()


class Client:
    namespace = "prod"

    def __init__(self, refuse: bool) -> None:
        self.operator_service = Operator(refuse)


async def test_a_refused_listing_is_said_as_unknown_not_missing() -> None:
    with pytest.raises(SearchAttributesUnknown) as err:
        await ensure_search_attributes(Client(refuse=True), register=False)  # type: ignore[arg-type]
    text = str(err.value)
    assert "cannot tell" in text and "PERMISSION_DENIED" in text and "prod" in text
    assert "temporal operator search-attribute create" in text


async def test_a_listing_without_them_still_says_which_are_missing() -> None:
    with pytest.raises(SetupError) as err:
        await ensure_search_attributes(Client(refuse=False), register=False)  # type: ignore[arg-type]
    assert not isinstance(err.value, SearchAttributesUnknown)
    assert "KubeCluster" in str(err.value) and "are not registered" in str(err.value)
