"""`tuner model ...`: models that need no download."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from tuner.cli.options import JsonOption
from tuner.common.console import out, print_json
from tuner.common.models import inspect_model, shipped_architectures, write_architecture, write_tiny_model

model_app = typer.Typer(help="Models that need no download.", no_args_is_help=True)


@model_app.command("tiny")
def model_tiny(folder: Annotated[Path, typer.Argument(help="Where to write the model.")],
               seed: Annotated[int, typer.Option(help="Seed of the random weights and tokenizer corpus.")] = 0) -> None:
    """Write a tiny Llama-architecture model with random weights and a locally trained tokenizer."""
    with out.status("writing tiny model"):
        write_tiny_model(folder, seed)
    out.print(f"tiny model written to {folder}")


@model_app.command("arch")
def model_arch(name: Annotated[str, typer.Argument(help="A shipped architecture, see `tuner model list`.")],
               folder: Annotated[Path, typer.Argument(help="Where to write its config.json.")]) -> None:
    """Write a config-only real architecture, served with --load-format dummy (random weights, real shape)."""
    write_architecture(name, folder)
    out.print(f"{name} config written to {folder} (served with --load-format dummy)")


@model_app.command("list")
def model_list(as_json: JsonOption = False) -> None:
    """The config-only architectures that ship with tuner."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in shipped_architectures():
            info = inspect_model(write_architecture(name, Path(tmp) / name))
            rows.append({"name": name, "architecture": info.architecture, "vocab_size": info.vocab_size,
                         "max_position_embeddings": info.max_position_embeddings,
                         "kv_bytes_per_token": info.kv_bytes_per_token})
    if as_json:
        return print_json(rows)
    table = Table("name", "architecture", "vocab", "max positions", "KV KiB/token")
    for r in rows:
        table.add_row(r["name"], r["architecture"], str(r["vocab_size"]), str(r["max_position_embeddings"]),
                      f"{r['kv_bytes_per_token'] / 1024:g}")
    out.print(table)
