"""Records on the wire (schema_version 1).

Inputs are strict about shape (unknown top-level fields are kept in `metadata` by the
producer, not silently accepted here) and lenient about what is optional. Outputs carry
nothing wall-clock, so the same event and policy always serialise to the same bytes.
"""

from __future__ import annotations

import re
import unicodedata
from datetime import date
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

SCHEMA_VERSION = 1


_ISO_DATE = re.compile("[0-9]{4}-[0-9]{2}-[0-9]{2}")


def _iso_date(value: object) -> object:
    """A date as the published schemas type it (format "date"): "YYYY-MM-DD" only. Pydantic
    would also read an epoch number or a string of digits as a date, which a producer
    following the schema never sends and a reader of the event would not read as one."""
    if isinstance(value, date) or (isinstance(value, str) and _ISO_DATE.fullmatch(value)):
        return value
    if isinstance(value, bool):
        kind = "true or false"
    elif isinstance(value, int | float):
        kind = "a number"
    else:
        kind = "text in another form" if isinstance(value, str) else type(value).__name__
    raise ValueError(f'a date is written as the text "YYYY-MM-DD", not as {kind}')


IsoDate = Annotated[date, BeforeValidator(_iso_date)]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Message(_Record):
    """One chat message of the prompt: the system prompt, earlier turns, the user message."""

    role: Literal["system", "user", "assistant"]
    content: str


class HistoryTurn(Message):
    """An earlier turn of the conversation, on input: only the user or the assistant speaks.

    The system role is the operator's: a turn that claimed it would let whoever writes the
    event speak with the voice that sets the rules, so the schema rejects it.
    """

    role: Literal["user", "assistant"]


# Brackets, and the fullwidth and small forms NFKC folds to them.
_LABEL_BRACKETS = re.compile("[\\[\\]<>\ufe47\ufe48\uff3b\uff3d\ufe64\ufe65\uff1c\uff1e]")
_UNPRINTED = frozenset({"Cc", "Cf", "Zl", "Zp"})  # controls, format characters, line breaks
# Default-ignorable code points that str.isprintable passes (marks and Hangul fillers): a
# reader sees nothing, so "pub" followed by one reads as the label "pub".
_IGNORABLE_PRINTABLE = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180d\u180f\u3164\ufe00-\ufe0f\uffa0"
    "\U000e0100-\U000e01ef]"
)
SHOWN_ID_CHARS = 64  # of a chunk_id quoted in an error message


def _label_key(chunk_id: str) -> str:
    """What a reader takes a label for: case folded, blanks gone (ids are already in NFKC
    form with nothing invisible, or rejected)."""
    return "".join(chunk_id.casefold().split())


def _shown_id(chunk_id: str) -> str:
    cut = chunk_id[:SHOWN_ID_CHARS]
    return repr(cut) if cut == chunk_id else f"{cut!r}…"


class Chunk(_Record):
    """A retrieved passage, as the reranker ranked it."""

    chunk_id: str = Field(
        min_length=1,
        description="Printed as the passage label: in Unicode NFKC form, with no line "
        "break, control, format or invisible character, or bracket [ ] < > (nor a fullwidth "
        "form of one); no two chunk_ids of an event differ only in case or blanks.",
    )
    text: str
    doc_id: str | None = Field(default=None, description="Defaults to chunk_id.")
    # strict: "0.9", true and false are not numbers, as the published schema says.
    score: float | None = Field(default=None, allow_inf_nan=False, strict=True)
    title: str | None = None
    section: str | None = None
    source: str | None = None
    doc_type: str | None = None
    version: str | None = None
    effective_from: IsoDate | None = None
    effective_to: IsoDate | None = Field(default=None, description="Last day in force, inclusive.")
    audience: list[str] = Field(default_factory=list, description="Empty: everyone may read it.")
    embedding: list[Annotated[float, Field(strict=True)]] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("chunk_id")
    @classmethod
    def _usable_as_label(cls, value: str) -> str:
        """The chunk_id is printed as the label the model cites ("[doc#3] ..."), so it must
        read as one label: a line break, a control or format character or a bracket could end
        it early, forge another passage's header or close <documents>.

        Rejected rather than escaped: a citation then names the chunk_id exactly, and real ids
        ("doc#3", "a/b:c", "Fläche-3", "文書/2") hold none of these characters.
        """
        found = _LABEL_BRACKETS.search(value) or (
            None if value.isascii() else _IGNORABLE_PRINTABLE.search(value)
        )
        culprit = found.group() if found else None
        if culprit is None and not value.isprintable():  # printable: none of them, in C
            culprit = next((c for c in value if unicodedata.category(c) in _UNPRINTED), None)
        if culprit is not None:
            raise ValueError(
                f"chunk_id holds {culprit!r} (U+{ord(culprit):04X}); it is printed as the "
                "passage label, which may not hold a line break, a control, format or "
                "invisible character, or a bracket [ ] < > (nor a fullwidth form of one)"
            )
        if not value.isascii() and not unicodedata.is_normalized("NFKC", value):
            culprit = next((c for c in value if unicodedata.normalize("NFKC", c) != c), None)
            shown = f" {culprit!r} (U+{ord(culprit):04X})" if culprit else ""
            raise ValueError(
                f"chunk_id holds{shown or ' characters'} that read as others (it is not in "
                "Unicode NFKC form: fullwidth or styled letters, a no-break space...); it is "
                "printed as the passage label, which must read as itself"
            )
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _version_as_text(cls, value: object) -> object:
        # A JSON number has lost what the producer wrote (1.10 parses as 1.1): only text
        # says which version it is.
        if isinstance(value, float):
            raise ValueError(
                f'version must be a string such as "1.10"; the JSON number {value} cannot say '
                f'whether it meant "{value}" or "{value}0"'
            )
        if isinstance(value, int) and not isinstance(value, bool):
            raise ValueError(f'version must be a string such as "{value}", not a JSON number')
        return value

    @model_validator(mode="after")
    def _dates_in_order(self) -> Chunk:
        if self.effective_from and self.effective_to and self.effective_to < self.effective_from:
            raise ValueError("effective_to is before effective_from")
        return self

    @property
    def document(self) -> str:
        return self.doc_id or self.chunk_id


class RetrievalResult(_Record):
    """Input event: one chat request and its reranked passages, best first."""

    schema_version: Literal[1] = 1
    request_id: str = Field(min_length=1)
    question: str
    chunks: list[Chunk] = Field(default_factory=list)
    audience: str | None = Field(default=None, description="Who will read the answer.")
    as_of: IsoDate | None = Field(default=None, description="Date the answer must hold on.")
    history: list[HistoryTurn] = Field(default_factory=list)
    policy: str | None = Field(default=None, description="Name of a server-side policy.")
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _labels_apart(self) -> RetrievalResult:
        """Two chunk_ids that read as one label (case or blanks apart) would let forged text
        be cited as the other; one id repeated is one passage and is allowed."""
        seen: dict[str, str] = {}
        for chunk in self.chunks:
            other = seen.setdefault(_label_key(chunk.chunk_id), chunk.chunk_id)
            if other != chunk.chunk_id:
                raise ValueError(
                    f"chunk_ids {_shown_id(other)} and {_shown_id(chunk.chunk_id)} read as "
                    "the same passage label (they differ only in case or blanks)"
                )
        return self


class DropReason(StrEnum):
    DUPLICATE = "duplicate"
    NEAR_DUPLICATE = "near_duplicate"
    OVER_BUDGET = "over_budget"
    BELOW_MIN_SCORE = "below_min_score"
    MAX_CHUNKS = "max_chunks"
    ACCESS_DENIED = "access_denied"
    NOT_IN_FORCE = "not_in_force"
    EMPTY = "empty"


class RejectReason(StrEnum):
    """Why an input was not assembled: the reason of its error record or dead letter."""

    JSON = "json"  # not UTF-8, not strict JSON (a repeated key, NaN, infinity)
    SCHEMA = "schema"  # valid JSON, not a RetrievalResult
    LIMITS = "limits"  # over max_event_bytes, max_chunks, max_chunk_chars, max_question_chars
    POLICY = "policy"  # names a policy the operator did not allow
    BUDGET = "budget"  # the instructions and the question alone overflow the window
    ENGINE = "engine"  # a bug: the event is kept for replay
    OUTPUT_TOO_LARGE = "output_too_large"  # its prompt or audit is over the message size limit


class Citation(_Record):
    label: str
    chunk_id: str
    doc_id: str
    source: str | None = None
    title: str | None = None
    section: str | None = None
    version: str | None = None


class TokenUsage(_Record):
    context: int = Field(
        description="Tokens of the published context: the kept passages with their headers "
        "and the separators between them."
    )
    prompt: int = Field(description="Tokens of every message, chat overhead included.")
    budget: int = Field(description="Passage budget this request was packed against.")
    tokenizer: str


class PolicyRef(_Record):
    name: str
    hash: str


class EngineInfo(_Record):
    name: Literal["context-assembler"] = "context-assembler"
    version: str


class AnthropicText(_Record):
    type: Literal["text"] = "text"
    text: str


class AnthropicCitationsConfig(_Record):
    enabled: bool


class AnthropicSearchResult(_Record):
    """One kept passage as a search_result content block: Claude cites it by its index
    among the request's search results (`search_result_location`)."""

    type: Literal["search_result"] = "search_result"
    source: str = Field(description="The chunk's source, else its doc_id.")
    title: str = Field(description='The passage header, which opens with "[label]".')
    content: list[AnthropicText] = Field(description="The passage text, one text block.")
    citations: AnthropicCitationsConfig


class AnthropicMessage(_Record):
    role: Literal["user", "assistant"]
    content: str | list[AnthropicSearchResult | AnthropicText]


class AnthropicRequest(_Record):
    """The body of Anthropic's Messages API but `model`, `max_tokens` and sampling
    settings: the last user message holds the search results, then the question."""

    system: str
    messages: list[AnthropicMessage]


class CohereDocument(_Record):
    id: str = Field(description="The passage label: Cohere's citations name it.")
    data: dict[str, str] = Field(description="The header fields present, then `text`.")


class CohereRequest(_Record):
    """The body of Cohere's Chat API v2 but `model` and sampling settings."""

    messages: list[Message]
    documents: list[CohereDocument]


class AssembledPrompt(_Record):
    """Output for the generation service."""

    schema_version: Literal[1] = 1
    request_id: str
    messages: list[Message]
    context: str
    citations: list[Citation]
    tokens: TokenUsage
    abstained: bool = Field(description="Nothing relevant is left: the answer must say so.")
    policy: PolicyRef
    engine: EngineInfo
    provider_request: AnthropicRequest | CohereRequest | None = Field(
        default=None,
        description="The same prompt as a provider API's request body, under the policy's "
        "`[render] format` (anthropic or cohere); absent in the messages format.",
    )

    @model_serializer(mode="wrap")
    def _absent_when_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The messages format writes the bytes it wrote before the field existed."""
        data: dict[str, Any] = handler(self)
        if self.provider_request is None:
            data.pop("provider_request", None)
        return data


class CitedPassage(_Record):
    """A citation of the answer, resolved to the passage the prompt gave that label."""

    label: str
    chunk_id: str
    doc_id: str
    source: str | None = None
    version: str | None = None


class CitationCheck(_Record):
    """What an answer cites, checked against the prompt it answers."""

    schema_version: Literal[1] = 1
    request_id: str
    cited: list[CitedPassage] = Field(
        description="Each citation of a passage of the prompt, in the answer's order.")
    invented: list[str] = Field(
        description="Labels the answer cites that no passage of the prompt has, each once, "
        "as first read (look-alikes folded).")
    uncited: list[str] = Field(description="Labels of the prompt's passages never cited.")


class CitationRequest(_Record):
    """`POST /v1/citations/check`: a published prompt and the answer to it."""

    prompt: AssembledPrompt
    answer: str | dict[str, Any] = Field(
        description="The answer's text, or the provider's response body as JSON: an "
        "Anthropic Messages response or a Cohere Chat v2 response.")


class AnswerRecord(_Record):
    """A line of `context-assembler citations --answers`: the answer to the prompt that
    has this request_id."""

    request_id: str
    answer: str | dict[str, Any] = Field(
        description="The answer's text, or the provider's response body as JSON.")


class SentencesKept(_Record):
    """What compression kept of one passage, in sentences (a sentence too long to take
    whole counts as its pieces)."""

    kept: int = Field(ge=0, description="The passage's sentences in the prompt.")
    of: int = Field(ge=1, description="The passage's sentences in all.")


class KeptChunk(_Record):
    chunk_id: str
    doc_id: str
    rank: int = Field(description="1-based position in the input list.")
    label: str
    tokens: int
    compressed: bool = False
    sentences: SentencesKept | None = Field(
        default=None,
        description="Where compression ran on the passage (`[compress] mode = \"focused\"`): "
        "its sentences kept, of how many (kept < of: text was left out); absent where "
        "compression did not run on it.",
    )

    @model_serializer(mode="wrap")
    def _absent_when_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Where compression did not run, the bytes written before the field existed."""
        data: dict[str, Any] = handler(self)
        if self.sentences is None:
            data.pop("sentences", None)
        return data


class DroppedChunk(_Record):
    chunk_id: str
    doc_id: str
    rank: int
    reason: DropReason
    detail: str
    duplicate_of: str | None = Field(default=None, description="The kept chunk it copies.")
    similarity: float | None = None


class AssemblyAudit(_Record):
    """Output for the audit service: every input chunk appears once, kept or dropped."""

    schema_version: Literal[1] = 1
    request_id: str
    policy: PolicyRef
    engine: EngineInfo
    kept: list[KeptChunk]
    dropped: list[DroppedChunk]
    tokens: TokenUsage
    abstained: bool
    history_turns_dropped: int = 0


class ErrorRecord(_Record):
    """A rejected input, with where it came from and why (error file / DLQ body)."""

    schema_version: Literal[1] = 1
    origin: str = Field(description="file:line or topic/partition/offset")
    reason: RejectReason = Field(description="Why the input was not assembled.")
    message: str
    request_id: str | None = None
    raw: str = Field(
        description="The start of the original input (at most 1024 bytes of it, cut at a "
        "character boundary), decoded as UTF-8 with replacement."
    )
    raw_bytes: int = Field(description="Length of the whole input in bytes.")
    raw_truncated: bool = Field(description="Whether `raw` holds only the start of the input.")
    raw_sha256: str = Field(description='Digest of the whole input: "sha256:<hex>".')


class PolicyRecord(_Record):
    """A policy the worker assembled under, on the compacted policies topic keyed by its hash,
    so a replay weeks later runs under the rules that were in force."""

    schema_version: Literal[1] = 1
    name: str = Field(description="The name it was published under (the hash leaves it out).")
    hash: str = Field(description='"sha256:<hex>" of `settings`, as outputs carry it.')
    engine: EngineInfo = Field(description="The engine that published it.")
    settings: dict[str, Any] = Field(
        description="Every rule but the name, section by section, as `context-assembler "
        "policy` prints them; the hash is worked out from these."
    )
