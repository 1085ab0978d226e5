"""What the ``rayjobs`` commands share: options declared once, the connection and submit bundles, and errors as
exit codes."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, Optional, TypeVar

import typer

from runner.reporter import say
from runner.errors import BadInput, RayJobsError
from runner.errors import ExitCode

if TYPE_CHECKING:
    from runner.client.connection import Connection, Target

F = TypeVar("F", bound=Callable[..., Any])

OutputOption = Annotated[str, typer.Option("--output", "-o", metavar="text|json", help="Output format.")]
JobIdArgument = Annotated[str, typer.Argument(metavar="ID", help="Submission id (or Ray job id).", show_default=False)]
GiveUpOption = Annotated[float, typer.Option("--give-up-after", min=1, metavar="SECONDS", help="Seconds without an answer from the "
                                             "cluster before following stops with exit code 4 (the job runs on).")]
SetOption = Annotated[Optional[list[str]], typer.Option("--set", metavar="KEY=VALUE", help="Override a spec field: KEY.PATH=VALUE "
                      "(value read as YAML, e.g. --set workload.train.epochs=3). Repeatable; beats the file.",
                      show_default=False)]
ValidateSetOption = Annotated[Optional[list[str]], typer.Option("--set", metavar="KEY=VALUE", help="Override a field before "
                              "checking (as in submit).", show_default=False)]
NoWaitOption = Annotated[bool, typer.Option("--no-wait", help="Print the id and return right after submitting.")]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Print what would be submitted (secrets masked); "
                                            "contact no cluster.")]
LocalOption = Annotated[bool, typer.Option("--local", help="Start the local cluster (or --cluster NAME) first if it "
                                           "is not running and no address is given.")]
StopOnInterruptOption = Annotated[bool, typer.Option("--stop-on-interrupt", help="Stop the job on Ctrl-C "
                                                     "(default: detach and leave it running).")]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="Do not stream the job's log.")]
RawOption = Annotated[bool, typer.Option("--raw", help="Show the log exactly as the job wrote it: Ray's own "
                                        "lines and the progress events too, and no live status block.")]
NoPreflightOption = Annotated[bool, typer.Option("--no-preflight", help="Submit even if no node offers the "
                                                 "entrypoint's resources (e.g. nodes that will join later).")]

# The five options every command that talks to a cluster takes, in this order.
_CONNECTION_OPTIONS: list[tuple[str, Any, Any]] = [
    ("address", Annotated[Optional[str], typer.Option(
        "--address", "-a", metavar="URL", help="Dashboard address, e.g. http://127.0.0.1:8265. Overrides the spec's "
        "'address', RAYJOBS_CLUSTER, RAY_API_SERVER_ADDRESS and RAY_ADDRESS; default: the local cluster.",
        show_default=False)], None),
    ("cluster", Annotated[Optional[str], typer.Option(
        "--cluster", metavar="NAME", help="A local cluster by name (`rayjobs cluster up --name NAME`) instead of an "
        "address. Overrides the spec's 'address', RAYJOBS_CLUSTER and RAY_ADDRESS.", show_default=False)], None),
    ("header", Annotated[Optional[list[str]], typer.Option(
        "--header", metavar="'NAME: VALUE'", help="Extra HTTP header 'Name: value' for the dashboard (repeatable; "
        "adds to RAY_JOB_HEADERS). Never printed.", show_default=False)], None),
    ("no_verify", Annotated[bool, typer.Option("--no-verify", help="Do not verify the dashboard's TLS certificate.")],
     False),
    ("ca_cert", Annotated[Optional[str], typer.Option(
        "--ca-cert", metavar="FILE", help="CA bundle to verify the dashboard's TLS certificate with.",
        show_default=False)], None),
]


@dataclass(frozen=True)
class ConnectionOptions:
    """What the user said about the cluster; ``runner.client.connection`` turns it into an address by its precedence."""

    address: str | None = None
    cluster: str | None = None
    headers: list[str] | None = None
    no_verify: bool = False
    ca_cert: str | None = None

    def target(self, spec_address: str | None = None, spec_address_source: str = "the spec") -> Target:
        """The address or local cluster name the precedence picks, from flags, spec and environment only."""
        from runner.client.connection import choose_target

        return choose_target(self.address, spec_address, spec_address_source, self.cluster)

    def resolve(self, spec_address: str | None = None, spec_address_source: str = "the spec") -> Connection:
        """The connection: address, headers (token included) and TLS verification.

        Raises:
            BadInput, NoCluster: see ``runner.client.connection.resolve_connection``.
        """
        from runner.client.connection import resolve_connection

        return resolve_connection(self.address, spec_address, spec_address_source, self.headers,
                                  verify=not self.no_verify, ca_cert=self.ca_cert, cluster_name=self.cluster)


def with_connection_options(command: F) -> F:
    """Give a command the connection options, handed to it as one ``connection: ConnectionOptions`` argument.

    The command declares ``connection: ConnectionOptions = ConnectionOptions()``; in its place the
    command line gets ``--address``, ``--cluster``, ``--header``, ``--no-verify`` and ``--ca-cert``.
    """
    return _options_in_place_of(command, "connection", _CONNECTION_OPTIONS, lambda values: ConnectionOptions(
        values["address"], values["cluster"], values["header"], values["no_verify"], values["ca_cert"]))


@dataclass(frozen=True)
class SubmitFlags:
    """How ``submit`` and ``rerun`` send a spec and follow its job: the options the two commands share."""

    no_wait: bool = False
    dry_run: bool = False
    output: str = "text"
    local: bool = False
    stop_on_interrupt: bool = False
    quiet: bool = False
    no_preflight: bool = False
    give_up_after: float = 60.0
    raw: bool = False


# The options of SubmitFlags, in this order after the connection options; defaults from the dataclass.
_SUBMIT_OPTIONS: list[tuple[str, Any, Any]] = [
    (name, annotation, getattr(SubmitFlags(), name)) for name, annotation in [
        ("no_wait", NoWaitOption), ("dry_run", DryRunOption), ("output", OutputOption), ("local", LocalOption),
        ("stop_on_interrupt", StopOnInterruptOption), ("quiet", QuietOption), ("no_preflight", NoPreflightOption),
        ("give_up_after", GiveUpOption), ("raw", RawOption)]]


def with_submit_flags(command: F) -> F:
    """Give a command the options of ``submit``, handed to it as one ``flags: SubmitFlags`` argument.

    The command declares ``flags: SubmitFlags = SubmitFlags()``; in its place the command line gets
    ``--no-wait``, ``--dry-run``, ``--output``, ``--local``, ``--stop-on-interrupt``, ``--quiet``,
    ``--no-preflight``, ``--give-up-after`` and ``--raw``.
    """
    return _options_in_place_of(command, "flags", _SUBMIT_OPTIONS, lambda values: SubmitFlags(**values))


def _options_in_place_of(command: F, bundle: str, options: list[tuple[str, Any, Any]],
                         build: Callable[[dict[str, Any]], Any]) -> F:
    """``command`` with the parameter ``bundle`` replaced by ``options`` on the command line, and ``build``
    turning their values back into that one argument when the command runs."""
    signature = inspect.signature(command, eval_str=True)

    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs[bundle] = build({name: kwargs.pop(name, default) for name, _, default in options})
        return command(*args, **kwargs)

    parameters: list[inspect.Parameter] = []
    for parameter in signature.parameters.values():
        if parameter.name != bundle:
            parameters.append(parameter)
            continue
        parameters += [inspect.Parameter(name, parameter.kind, default=default, annotation=annotation)
                       for name, annotation, default in options]
    if bundle not in signature.parameters:
        raise TypeError(f"{command.__name__} declares no {bundle!r} parameter")
    wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
    return wrapper  # type: ignore[return-value]


def fail(message: str, code: ExitCode) -> NoReturn:
    """Print ``rayjobs: error: …`` and exit with ``code``."""
    say(f"error: {message}")
    raise typer.Exit(int(code))


def check_output(output: str) -> None:
    """Raise BadInput unless ``--output`` is text or json."""
    if output not in ("text", "json"):
        raise BadInput(f"--output must be 'text' or 'json', not {output!r}")


def handles_errors(command: F) -> F:
    """Turn the library's exceptions into a one-paragraph message and an exit code."""

    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from jobs.errors import SpecError

        try:
            return command(*args, **kwargs)
        except SpecError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(int(ExitCode.BAD_INPUT)) from None
        except RayJobsError as exc:
            fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            # Click would print "Aborted!" and exit 1, which a script cannot tell from a failed job.
            say("interrupted")
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None

    return wrapper  # type: ignore[return-value]
