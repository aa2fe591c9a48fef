"""The published figures a run set is compared with: an experiment's config file gives
them in its ``[experiment.paper]`` table (G and P per cell, and their source), read and
checked here for ``fedreg-report --paper`` and for the runner's own config files, with
the setting the file runs so that a comparison says where our runs were of another
(:meth:`PaperCells.setting_gaps`). Apart from :mod:`fedreg_tools.run_records`: these
figures come from a TOML config, not from what the runs wrote.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedreg_app.core.config import EARLIER_MEANING, PLACE_KEYS, ConfigError, RunConfig
from fedreg_tools.run_records import RunResult

#: Where a config file keeps the published figures its runs reproduce.
PAPER_TABLE = "paper"
PAPER_FIGURES = ("G", "P")


@dataclass(frozen=True)
class PaperCells:
    """The published G and P (percent) of an experiment's cells, from its config file's
    ``[experiment.paper]`` table: ``source = "..."`` and one ``cell = { G = .., P = .. }``
    per cell (a cell is an algorithm, or the report's cell name of a variant)."""

    experiment: str
    source: str
    cells: dict[str, dict[str, float]]
    #: the run-config keys its file sets, and its ``[experiment]`` clients: the setting
    #: the figures are set beside (``--paper``; empty for the runner's own file)
    setting: dict[str, Any] = field(default_factory=dict)

    def setting_gaps(self, runs: Sequence[RunResult]) -> list[str]:
        """``key=the runs', not the file's`` for each key the file sets that some run
        was not run with (where the run happened aside): the differences in points then
        compare two settings, which the table must say."""
        gaps: dict[str, None] = {}
        for run in runs:
            config = {**run.document["config"], "clients": run.clients}
            for key, value in self.setting.items():
                if key not in PLACE_KEYS and key in config and config[key] != value:
                    gaps[f"{key}={config[key]!r}, not {value!r}"] = None
        return list(gaps)

    @classmethod
    def from_table(cls, experiment: str, table: Any, where: str) -> PaperCells:
        """Checked: ``source`` a string, each cell a table of G and/or P in [0, 100];
        :class:`ConfigError` names the file and the key otherwise."""
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: [experiment.{PAPER_TABLE}] must be a table")
        source = table.get("source")
        if not isinstance(source, str) or not source.strip():
            raise ConfigError(f"{where}: [experiment.{PAPER_TABLE}] source must name where "
                              "the figures come from (a non-empty string)")  # fmt: skip
        cells: dict[str, dict[str, float]] = {}
        for cell, figures in table.items():
            if cell == "source":
                continue
            key = f"{where}: experiment.{PAPER_TABLE}.{cell}"
            if not isinstance(figures, dict) or not figures:
                raise ConfigError(f"{key} must be a table like {{ G = 84.27, P = 84.27 }}")
            unknown = sorted(set(figures) - set(PAPER_FIGURES))
            if unknown:
                raise ConfigError(f"{key}: unknown figure(s) {', '.join(unknown)}; allowed: "
                                  + ", ".join(PAPER_FIGURES))  # fmt: skip
            for name, value in figures.items():
                number = isinstance(value, int | float) and not isinstance(value, bool)
                if not number or not 0 <= value <= 100:
                    raise ConfigError(f"{key}.{name}={value!r}: expected a percentage in [0, 100]")
            cells[str(cell)] = {name: float(value) for name, value in figures.items()}
        return cls(experiment, source.strip(), cells)


def read_paper_cells(path: Path) -> PaperCells:
    """The ``[experiment.paper]`` table of a config file (``ConfigError`` if it has none)."""
    try:
        document = tomllib.loads(path.read_text())
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror or err})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: is not TOML ({err})") from None
    meta = document.get("experiment", {})
    if not isinstance(meta, dict):
        raise ConfigError(f"{path}: 'experiment' is {meta!r}; expected an [experiment] table")
    if PAPER_TABLE not in meta:
        raise ConfigError(f"{path}: has no [experiment.{PAPER_TABLE}] table of published figures")
    cells = PaperCells.from_table(str(meta.get("name", path.stem)), meta[PAPER_TABLE], str(path))
    varied = {"algo", *meta.get("grid", {}), *(k for v in meta.get("variants", {}).values()
                                                 for k in v)}  # fmt: skip
    setting = {k: v for k, v in document.items() if k != "experiment" and k not in varied
               and not (k == "head-depth" and v == "auto")}  # fmt: skip
    # a key whose default changed since the records this file may meet were made: the
    # file's setting is today's default, which those records did not run (as_ran)
    core = RunConfig.core_keys()
    setting |= {k: core[k] for k in EARLIER_MEANING if k in core and k not in setting}
    if "clients" in meta:
        setting["clients"] = meta["clients"]
    return dataclasses.replace(cells, setting=setting)
