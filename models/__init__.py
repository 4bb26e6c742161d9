"""Model families (transformers style). Importing this package registers them."""

from memlab.models import token_lm  # noqa: F401
from memlab.models import sonar  # noqa: F401
from memlab.models import memory  # noqa: F401
from memlab.models import sentence  # noqa: F401  (a library of the sentence families; registers 'toy_ae')
from memlab.models import sonar_llm  # noqa: F401
from memlab.models import lcm  # noqa: F401
