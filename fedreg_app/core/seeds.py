"""Every random stream of a run, derived from the run's ``seed`` on this one page.

"Same seed, same numbers": each purpose draws from its own stream, so adding a draw in one
place never shifts another. A stream is ``SeedSequence([seed, *tag, *context])``; the tags
are fixed constants (they keep the numbers of earlier versions of this project).

| stream          | tag     | context                     | used for                               |
|-----------------|---------|-----------------------------|----------------------------------------|
| ``sampling``    | 0x5A3   | -                           | the clients sampled each round         |
| ``participation``| 0x9A7  | -                           | Dirichlet(gamma) participation weights |
| ``natural-ids`` | 0x1D    | -                           | which speakers/writers become clients  |
| ``topup``       | 0xD1    | -                           | the ``dirichlet-topup`` partitioner    |
| ``gpfl-init``   | 0x6F1   | -                           | GPFL's embedding and valve init        |
| ``private-init``| 0xFE9   | -                           | FedReG's random head_p init            |
| ``shuffle``     | -       | partition, round, step      | mini-batch order of a training step    |
| ``rebalance``   | -       | partition                   | FedReG's augmentation of rare classes  |
| ``central-shuffle``| 0xCE7 | round                   | centralised training's mini-batches |
| ``dp-noise``    | 0xD9    | round                       | central DP's noise on the aggregate    |
| ``dp-local-noise``| 0xD10 | partition, round            | local DP's noise on a client's update  |
| ``attackers``   | 0xA77   | number of partitions        | the partitions an attack makes lie     |
| ``attack-noise``| 0xA70   | partition, round            | the ``noise`` attack's update          |
| ``ala-sample``  | 0xA1A   | partition, round of global  | FedALA's sample to learn its weights   |
| ``new-clients`` | 0x9E3   | number of partitions        | the partitions held out of training    |
| ``fedcp-init``  | 0xFC1   | -                           | FedCP's policy network init            |
| ``fedcp-gumbel``| 0xFC6   | partition, round            | FedCP's Gumbel noise on the policies   |

Outside this table, by design: the model's initialisation (``torch.manual_seed(seed)``,
identical on every client and the server) and flwr-datasets' partitioners and
train/test split, which take the run's seed itself.
"""

from __future__ import annotations

import numpy as np
import torch

STREAMS: dict[str, tuple[int, ...]] = {
    "sampling": (0x5A3,),
    "participation": (0x9A7,),
    "natural-ids": (0x1D,),
    "topup": (0xD1,),
    "gpfl-init": (0x6F1,),
    "private-init": (0xFE9,),
    "shuffle": (),
    "rebalance": (),
    "central-shuffle": (0xCE7,),
    "dp-noise": (0xD9,),
    "dp-local-noise": (0xD10,),
    "attackers": (0xA77,),
    "attack-noise": (0xA70,),
    "ala-sample": (0xA1A,),
    "new-clients": (0x9E3,),
    "fedcp-init": (0xFC1,),
    "fedcp-gumbel": (0xFC6,),
    "fltrust-root": (0xF17,),
    "fltrust-shuffle": (0xF15,),
    "flame-noise": (0xF1A,),
}


def sequence(seed: int, stream: str, *context: int) -> np.random.SeedSequence:
    if stream not in STREAMS:
        raise KeyError(f"unknown random stream {stream!r}; the streams are {sorted(STREAMS)}")
    return np.random.SeedSequence([seed, *STREAMS[stream], *context])


def rng(seed: int, stream: str, *context: int) -> np.random.Generator:
    """A numpy generator for one stream (and context)."""
    return np.random.default_rng(sequence(seed, stream, *context))


def seed_int(seed: int, stream: str, *context: int) -> int:
    """A 32-bit integer seed for libraries that take one (torch, torchvision)."""
    return int(sequence(seed, stream, *context).generate_state(1)[0])


def torch_generator(seed: int, stream: str, *context: int) -> torch.Generator:
    """A torch generator for one stream, from 64 bits of entropy."""
    entropy = sequence(seed, stream, *context).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(entropy))


def drawn_partitions(seed: int, stream: str, num_partitions: int, count: int) -> frozenset[int]:
    """``count`` of the ``num_partitions`` partitions, a seeded draw that depends on the
    seed and N only, so that the server and every client name the same ones (the
    attackers, the held-out new clients)."""
    order = rng(seed, stream, num_partitions).permutation(num_partitions)
    return frozenset(int(p) for p in order[:count])
