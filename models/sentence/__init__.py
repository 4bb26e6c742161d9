"""Shared sentence-LM pieces of the SONAR-LLM and LCM families: a library, not a family.

The backbone (:mod:`.modeling_sentence`, :mod:`.configuration_sentence` with the shared presets),
the data path and base recipe (:mod:`.data`, :mod:`.recipe`), the decoder cross-entropy
(:mod:`.objective`), space loading (:mod:`.spaces`), sentence-by-sentence generation
(:mod:`.generation`) and the ``toy_ae`` test space (:mod:`.toy_space`). Families import from here;
this package imports no family. Importing it registers the ``toy_ae`` space.
"""

from memlab.models.sentence import toy_space  # noqa: F401  (registers the 'toy_ae' space)
