"""Errors callers can catch by type; each names what is at fault and what to do."""

from __future__ import annotations

import re

__all__ = ["AckstreamError", "OptionError", "EnvironmentProblem", "StageError"]

_SECRET = re.compile(r"password|secret|jaas|token|credential", re.IGNORECASE)


class AckstreamError(Exception):
    """Root of every error ackstream raises on purpose."""


class OptionError(AckstreamError, ValueError):
    """An option has a value ackstream cannot use. The value of an option whose name
    says it holds a secret (a password, a JAAS config) is never shown."""

    def __init__(self, option: str, value, allowed: str):
        if _SECRET.search(str(option)) and value is not None:
            value = "***"
        self.option, self.value, self.allowed = option, value, allowed
        super().__init__(f"option {option!r} = {value!r} is not valid: expected {allowed}")


class EnvironmentProblem(AckstreamError, RuntimeError):
    """Something outside ackstream (Java, a broker, a path) is missing or wrong."""

    def __init__(self, what: str, fix: str):
        self.what, self.fix = what, fix
        super().__init__(f"{what}. {fix}")


class StageError(AckstreamError, ValueError):
    """A bolt stage is declared or written so that ackstream cannot track its tuples."""

    def __init__(self, stage: str, problem: str):
        self.stage, self.problem = stage, problem
        super().__init__(f"stage {stage!r}: {problem}")
