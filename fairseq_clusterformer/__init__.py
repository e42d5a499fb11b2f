"""Cluster-Former for fairseq: load with ``--user-dir fairseq_clusterformer`` (or ``import fairseq_clusterformer``).

Importing the package makes good what fairseq 0.12 lacks (``compat.patches``: one place, a comment per patch) and
registers the language model and its task (``lm``) and the QA model, task and criterion (``qa``). fairseq's
--user-dir loader imports only the package itself here (it would also import ``models/`` and ``tasks/`` folders,
which this package does not have), so everything is registered from this file. The map of the package:
docs/architecture.md.
"""

import logging
import sys

# fairseq's text-to-speech task, imported with every task, says "Please install tensorboardX" whenever that package is
# missing, though --tensorboard-logdir works without it (through torch.utils.tensorboard): a line on every command
# that no user can act on. Dropped before fairseq is first imported here (a fairseq console script has imported it
# already, and said it).
logging.getLogger("fairseq.tasks.text_to_speech").addFilter(lambda record: "tensorboardX" not in record.getMessage())

from fairseq_clusterformer.compat.patches import install_patches  # noqa: E402

# before any dataset is batched or checkpoint loaded: see compat/patches.py for what each patch restores
install_patches()

from fairseq_clusterformer.compat.autocast_bf16 import explain_flag_outside_its_tasks  # noqa: E402
from fairseq_clusterformer.lm import architectures, model, task  # noqa: E402, F401
from fairseq_clusterformer.qa import criterion, model, task  # noqa: E402, F401, F811

# before fairseq parses the command line that imported the package (its bare "unrecognized arguments" follows)
explain_flag_outside_its_tasks(sys.argv)
