"""Configuration of SONAR-LLM: the shared sentence-LM config under its own ``model_type``."""

from __future__ import annotations

from memlab.models.sentence.configuration_sentence import SentenceLMConfig


class SonarLLMConfig(SentenceLMConfig):
    """SONAR-LLM: a Llama decoder over sentence embeddings, trained through the space's frozen decoder.

    Same arguments as :class:`~memlab.models.sentence.configuration_sentence.SentenceLMConfig`.
    """

    model_type = "memlab_sonar_llm"

    def __init__(self, **kwargs):  # explicit: transformers would otherwise generate a dataclass __init__
        super().__init__(**kwargs)
