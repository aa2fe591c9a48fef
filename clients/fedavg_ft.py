"""FedAvg with fine-tuning (FedAvg-FT): FedAvg's global model, fine-tuned on each client
before its personal evaluation.

Training is FedAvg's round. Before every personal evaluation (``ft-when = "every-eval"``)
or only the last round's (``"final"``) the client copies the global model and trains the
copy ``ft-epochs`` epochs on its own train split with the run's optimiser settings (fresh
momentum): the whole model, or with ``ft-scope = "head"`` the head on the frozen base's
features. The copy is the personal model; nothing of it is kept, so the next round starts
from the server's model as FedAvg's does. The global figure is the global model itself.

The simple baseline of Yu et al., "Salvaging Federated Learning by Local Adaptation"
(2020), and of Cheng et al., "Fine-tuning is Fine in Federated Learning" (2021), which
find it hard to beat; pFL-Bench (Chen et al., NeurIPS 2022) reports it as "FedAvg-FT".
"""

from __future__ import annotations

from dataclasses import dataclass

from clients.fedavg import FedAvgClient
from fedreg_app.core.config import AlgorithmOptions, at_least, option

#: ``ft-when``: fine-tune before every evaluation, or before the last round's only.
FT_WHEN = ("every-eval", "final")
#: ``ft-scope``: what the fine-tuning trains.
FT_SCOPES = ("model", "head")


@dataclass(frozen=True)
class FedAvgFTOptions(AlgorithmOptions):
    ft_epochs: int = option(
        "ft-epochs", 1, "an integer >= 0", at_least(0),
        doc="FedAvg-FT: epochs of fine-tuning the global model on the client's train "
        "split before its personal evaluation.",
        source="our choice: one epoch, the local round of Table 2 (E = 1); Cheng et al. "
        "2021 vary the fine-tuning budget, FedBABU's `finetune-epochs` is 10",
    )  # fmt: skip
    ft_scope: str = option(
        "ft-scope", "model", f"one of {', '.join(FT_SCOPES)}",
        lambda value: value in FT_SCOPES,
        doc="FedAvg-FT: fine-tune the whole `model`, or the `head` on the frozen base.",
        source="Yu et al. 2020 and Cheng et al. 2021 fine-tune the whole model; PFLlib's "
        "`fine_tune` defaults to base and head",
    )  # fmt: skip
    ft_when: str = option(
        "ft-when", "every-eval", f"one of {', '.join(FT_WHEN)}",
        lambda value: value in FT_WHEN,
        doc="FedAvg-FT: fine-tune before `every-eval`uation (every round's P is the "
        "fine-tuned model's), or only at the `final` round's (P = G before it).",
        source="pFL-Bench (Chen et al. 2022) reports FedAvg-FT's fine-tuned model at its "
        "evaluations",
    )  # fmt: skip


class FedAvgFTClient(FedAvgClient):
    #: With ``ft-when = "final"`` the fine-tune belongs to the last round.
    schedule_over_rounds = True

    @property
    def options(self) -> FedAvgFTOptions:
        return self.config.options_as(FedAvgFTOptions)

    def fine_tunes_at(self, server_round: int) -> bool:
        return self.options.ft_when == "every-eval" or server_round == self.config.num_server_rounds

    def prepare_personal_model(self, server_round: int) -> None:
        """Train this evaluation's copy of the global model on the client's train split."""
        options = self.options
        if self.fine_tunes_at(server_round) and options.ft_epochs > 0:
            self.fine_tune(options.ft_epochs, server_round, options.ft_scope == "model")
