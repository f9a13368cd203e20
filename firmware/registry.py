"""Named component registries: how a YAML profile (or ``--set``) picks a policy.

Each pluggable role (cache replacement, GC victim choice, migration policy,
context-switch policy) has one :class:`Registry`. A researcher adds a policy by
decorating its factory::

    from cxlssd.firmware.cache import REPLACEMENT_POLICIES

    @REPLACEMENT_POLICIES.register("mru")
    class MruPolicy(LruPolicy): ...

and selects it with ``--set cache.policy=mru``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from cxlssd.errors import ConfigError
from cxlssd.validation import did_you_mean

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> factory table for one pluggable role."""

    def __init__(self, role: str, key: str) -> None:
        self.role = role
        self.key = key  # the profile key that selects from this registry
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator registering ``factory`` under ``name``."""

        def decorate(factory: Callable[..., T]) -> Callable[..., T]:
            self._factories[name] = factory
            return factory

        return decorate

    def names(self) -> list[str]:
        return sorted(self._factories)

    def get(self, name: str) -> Callable[..., T]:
        """The factory registered as ``name``; a :class:`ConfigError` naming the choices if none."""
        try:
            return self._factories[name]
        except KeyError:
            raise ConfigError(
                f"unknown {self.role} {name!r} for {self.key}{did_you_mean(name, self.names())}; "
                f"choose one of: {', '.join(self.names())}"
            ) from None
