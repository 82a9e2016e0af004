"""The one way ``rlserve rollout`` talks to a cluster: the ``kubectl`` binary, as a subprocess.

Pods are reached through the API server's service proxy
(``/api/v1/namespaces/NS/services/NAME:http/proxy/...``), so the tool needs nothing but a
kubeconfig. With ``dry_run`` nothing runs: every command is printed instead, and a value
that would have been read from the cluster stands as a shell variable (``$REPLICAS``) in
the commands that use it.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from kernel.errors import RLServeError
from ops.bluegreen.names import Names
from ops.errors import KubectlError

# A number read from the cluster: an int, or in a dry run the shell variable standing for it.
Count = int | str


@dataclass
class Kubectl:
    binary: str = "kubectl"
    names: Names = field(default_factory=Names)
    dry_run: bool = False
    out: TextIO = field(default_factory=lambda: sys.stdout)

    def read(self, variable: str, *args: str) -> str:
        """One value (``-o jsonpath=...``); '' when the field is absent."""
        if self.dry_run:
            self.say(f"{variable}=$({self._line(args)})")
            return f"${variable}"
        return self._run(args).strip()

    def field(self, variable: str, kind: str, name: str, path: str) -> str:
        """One field of one object, by JSONPath, e.g. ``{.spec.replicas}``."""
        return self.read(variable, "get", kind, name, "-o", f"jsonpath={path}")

    def number(self, text: str) -> Count:
        """A count read with :meth:`read` (absent counts as 0)."""
        if self.dry_run:
            return text
        if text and not text.isdigit():
            raise KubectlError(f"expected a whole number from the cluster, got {text!r}")
        return int(text or 0)

    def document(self, *args: str) -> dict[str, Any] | None:
        """A whole object (``-o json``); None in a dry run."""
        if self.dry_run:
            self.say(self._line(args))
            return None
        return _json(self._run(args), self._line(args))

    def change(self, *args: str) -> None:
        if self.dry_run:
            self.say(self._line(args))
            return
        self._run(args)

    def succeeds(self, *args: str) -> bool:
        """Whether a command exits 0 (``rollout status``, a proxied GET of /ready)."""
        if self.dry_run:
            self.say(self._line(args))
            return True
        return self._call(args).returncode == 0

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """POST a JSON body through the API server (``kubectl create --raw``)."""
        if self.dry_run:
            self.say(self._line(("create", "--raw", path, "-f", "BODY.json")))
            return None
        with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
            json.dump(body, file)
            file.flush()
            args = ("create", "--raw", path, "-f", file.name)
            return _json(self._run(args), self._line(args))

    def when(self, condition: str, holds: Callable[[], bool]) -> bool:
        """Decide on values read earlier; a dry run cannot, so it says so and goes on."""
        if self.dry_run:
            self.say(f"# only if {condition}:")
            return True
        return holds()

    def refuse_if(
        self, condition: str, holds: Callable[[], bool], error: Callable[[], RLServeError]
    ) -> None:
        """Stop with ``error()`` when a condition on values read earlier holds."""
        if self.dry_run:
            self.say(f"# stops here if {condition}")
            return
        if holds():
            raise error()

    def say(self, text: str) -> None:
        print(text, file=self.out)

    def _line(self, args: tuple[str, ...]) -> str:
        return shlex.join(self._argv(args))

    def _argv(self, args: tuple[str, ...]) -> list[str]:
        return [self.binary, f"--namespace={self.names.namespace}", *args]

    def _call(self, args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(self._argv(args), capture_output=True, text=True, check=False)
        except FileNotFoundError:
            raise KubectlError(
                f"kubectl: {self.binary!r} not found; install kubectl or pass --kubectl PATH"
            ) from None

    def _run(self, args: tuple[str, ...]) -> str:
        done = self._call(args)
        if done.returncode != 0:
            raise KubectlError(
                f"`{self._line(args)}` failed (exit {done.returncode}): "
                f"{' '.join(done.stderr.split())[:300] or 'no message'}; "
                "check --namespace and the current kubeconfig context"
            )
        return done.stdout


def _json(text: str, command: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise KubectlError(f"`{command}` did not answer JSON: {text[:200]!r}") from None
    if not isinstance(value, dict):
        raise KubectlError(f"`{command}` answered {type(value).__name__}, expected an object")
    return value
