"""Lines a user cannot act on, kept off the terminal; set before fairseq is first imported by this package.

- fairseq's text-to-speech task, imported with every task, logs "Please install tensorboardX" when that package is
  missing, though --tensorboard-logdir works without it (through torch.utils.tensorboard). A fairseq console script
  has imported its tasks (and said it) before --user-dir imports this package; the package's own scripts and the hub
  are spared it.
- fairseq 0.12 composes its config through hydra 1.0's API: hydra 1.1+ warns on every command (deprecated calls, the
  version_base, the schema matching, the strict flag).
- faiss logs which instruction set it loads, and the ones it could not, as it is first imported.
"""

from __future__ import annotations

import logging
import warnings


def quiet_unactionable_output() -> None:
    logging.getLogger("fairseq.tasks.text_to_speech").addFilter(
        lambda record: "tensorboardX" not in record.getMessage()
    )
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"hydra(\.|$)")
    # attributed to the caller's caller ("sys:1"), not to hydra
    warnings.filterwarnings(
        "ignore", message=r"\s*'config' is validated against ConfigStore schema", category=UserWarning
    )
