"""The pipeline's settings: its areas composed (each declared in the package that owns it)."""

from __future__ import annotations

from pipeline.access.settings import AccessSettings
from pipeline.answer.settings import AnswerSettings, RetrievalSettings
from pipeline.attribution.settings import AttributionSettings
from pipeline.index.settings import IndexSettings
from pipeline.ingest.settings import IngestSettings
from pipeline.models.settings import LLMSettings, ModelSettings
from pipeline.runtime.config import SettingsGroup
from pipeline.runtime.settings import CoreSettings


class PipelineSettings(SettingsGroup):
    core: CoreSettings
    index: IndexSettings
    models: ModelSettings
    llm: LLMSettings
    ingest: IngestSettings
    retrieval: RetrievalSettings
    answer: AnswerSettings
    attribution: AttributionSettings
    access: AccessSettings
