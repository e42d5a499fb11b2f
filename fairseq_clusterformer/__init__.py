"""Cluster-Former for fairseq: load with ``--user-dir fairseq_clusterformer`` (or ``import fairseq_clusterformer``).

Importing the package makes good what fairseq 0.12 lacks (``compat.patches``: one place, a comment per patch) and
registers the language model and its task (``lm``) and the QA model, task and criterion (``qa``). fairseq's
--user-dir loader imports only the package itself here (it would also import ``models/`` and ``tasks/`` folders,
which this package does not have), so everything is registered from this file. The map of the package:
docs/architecture.md.
"""

import sys

from fairseq_clusterformer.compat.quiet import quiet_unactionable_output

# before fairseq is first imported here: see compat/quiet.py for what is kept off the terminal
quiet_unactionable_output()

from fairseq_clusterformer.compat.patches import install_patches  # noqa: E402

# before any dataset is batched or checkpoint loaded: see compat/patches.py for what each patch restores
install_patches()

from fairseq_clusterformer.compat.autocast_bf16 import explain_flag_outside_its_tasks  # noqa: E402
from fairseq_clusterformer.lm import architectures, model, task  # noqa: E402, F401
from fairseq_clusterformer.qa import criterion, model, task  # noqa: E402, F401, F811

# before fairseq parses the command line that imported the package (its bare "unrecognized arguments" follows)
explain_flag_outside_its_tasks(sys.argv)
