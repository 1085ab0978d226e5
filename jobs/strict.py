"""The base of every rayjobs settings model: unknown keys are errors, defaults are validated too."""

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A pydantic model that refuses unknown fields, so a misspelled key is an error, not a silent default."""

    model_config = ConfigDict(extra="forbid", validate_default=True)
