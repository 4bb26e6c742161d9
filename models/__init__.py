"""Model families (transformers style). Importing this package registers them."""

from memlab.models import token_lm  # noqa: F401
