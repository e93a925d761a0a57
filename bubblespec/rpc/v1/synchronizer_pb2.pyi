from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RankState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RANK_STATE_UNSPECIFIED: _ClassVar[RankState]
    RANK_STATE_IDLE: _ClassVar[RankState]
    RANK_STATE_DECODING: _ClassVar[RankState]
    RANK_STATE_PREGEN: _ClassVar[RankState]
    RANK_STATE_UPDATING_WEIGHTS: _ClassVar[RankState]
    RANK_STATE_LOST: _ClassVar[RankState]
    RANK_STATE_ENGINE_DEAD: _ClassVar[RankState]
    RANK_STATE_RELEASED: _ClassVar[RankState]
    RANK_STATE_STARTING: _ClassVar[RankState]

class PregenWindow(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PREGEN_WINDOW_UNSPECIFIED: _ClassVar[PregenWindow]
    PREGEN_WINDOW_BUBBLE: _ClassVar[PregenWindow]
    PREGEN_WINDOW_TRAINING: _ClassVar[PregenWindow]

class StepEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_EVENT_KIND_UNSPECIFIED: _ClassVar[StepEventKind]
    STEP_EVENT_KIND_OPENED: _ClassVar[StepEventKind]
    STEP_EVENT_KIND_STOP: _ClassVar[StepEventKind]
    STEP_EVENT_KIND_CLOSED: _ClassVar[StepEventKind]

class DraftStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DRAFT_STATUS_UNSPECIFIED: _ClassVar[DraftStatus]
    DRAFT_STATUS_STORED: _ClassVar[DraftStatus]
    DRAFT_STATUS_REJECTED_FULL: _ClassVar[DraftStatus]
    DRAFT_STATUS_REJECTED_STEP: _ClassVar[DraftStatus]
    DRAFT_STATUS_REJECTED_GAP: _ClassVar[DraftStatus]

class SpanKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPAN_KIND_UNSPECIFIED: _ClassVar[SpanKind]
    SPAN_KIND_DECODE: _ClassVar[SpanKind]
    SPAN_KIND_PREGEN: _ClassVar[SpanKind]
    SPAN_KIND_IDLE: _ClassVar[SpanKind]
    SPAN_KIND_PREGEN_WINDOW: _ClassVar[SpanKind]
    SPAN_KIND_PREGEN_TAIL: _ClassVar[SpanKind]
RANK_STATE_UNSPECIFIED: RankState
RANK_STATE_IDLE: RankState
RANK_STATE_DECODING: RankState
RANK_STATE_PREGEN: RankState
RANK_STATE_UPDATING_WEIGHTS: RankState
RANK_STATE_LOST: RankState
RANK_STATE_ENGINE_DEAD: RankState
RANK_STATE_RELEASED: RankState
RANK_STATE_STARTING: RankState
PREGEN_WINDOW_UNSPECIFIED: PregenWindow
PREGEN_WINDOW_BUBBLE: PregenWindow
PREGEN_WINDOW_TRAINING: PregenWindow
STEP_EVENT_KIND_UNSPECIFIED: StepEventKind
STEP_EVENT_KIND_OPENED: StepEventKind
STEP_EVENT_KIND_STOP: StepEventKind
STEP_EVENT_KIND_CLOSED: StepEventKind
DRAFT_STATUS_UNSPECIFIED: DraftStatus
DRAFT_STATUS_STORED: DraftStatus
DRAFT_STATUS_REJECTED_FULL: DraftStatus
DRAFT_STATUS_REJECTED_STEP: DraftStatus
DRAFT_STATUS_REJECTED_GAP: DraftStatus
SPAN_KIND_UNSPECIFIED: SpanKind
SPAN_KIND_DECODE: SpanKind
SPAN_KIND_PREGEN: SpanKind
SPAN_KIND_IDLE: SpanKind
SPAN_KIND_PREGEN_WINDOW: SpanKind
SPAN_KIND_PREGEN_TAIL: SpanKind

class RegisterRankRequest(_message.Message):
    __slots__ = ("rank_id", "address", "capacity", "weight_version", "vocab_size", "drafts_address")
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    DRAFTS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    rank_id: str
    address: str
    capacity: int
    weight_version: int
    vocab_size: int
    drafts_address: str
    def __init__(self, rank_id: _Optional[str] = ..., address: _Optional[str] = ..., capacity: _Optional[int] = ..., weight_version: _Optional[int] = ..., vocab_size: _Optional[int] = ..., drafts_address: _Optional[str] = ...) -> None: ...

class RegisterRankResponse(_message.Message):
    __slots__ = ("heartbeat_interval_s", "rank_timeout_s", "poll_every_decode_steps", "current_step", "instance_id", "max_message_bytes", "reregistered")
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    RANK_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    POLL_EVERY_DECODE_STEPS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_STEP_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    REREGISTERED_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_s: float
    rank_timeout_s: float
    poll_every_decode_steps: int
    current_step: int
    instance_id: str
    max_message_bytes: int
    reregistered: bool
    def __init__(self, heartbeat_interval_s: _Optional[float] = ..., rank_timeout_s: _Optional[float] = ..., poll_every_decode_steps: _Optional[int] = ..., current_step: _Optional[int] = ..., instance_id: _Optional[str] = ..., max_message_bytes: _Optional[int] = ..., reregistered: _Optional[bool] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("rank_id", "state", "weight_version", "step", "done_step")
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    DONE_STEP_FIELD_NUMBER: _ClassVar[int]
    rank_id: str
    state: RankState
    weight_version: int
    step: int
    done_step: int
    def __init__(self, rank_id: _Optional[str] = ..., state: _Optional[_Union[RankState, str]] = ..., weight_version: _Optional[int] = ..., step: _Optional[int] = ..., done_step: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("current_step", "stop", "instance_id")
    CURRENT_STEP_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    current_step: int
    stop: bool
    instance_id: str
    def __init__(self, current_step: _Optional[int] = ..., stop: _Optional[bool] = ..., instance_id: _Optional[str] = ...) -> None: ...

class ShardAssignment(_message.Message):
    __slots__ = ("rank_id", "num_requests")
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    rank_id: str
    num_requests: int
    def __init__(self, rank_id: _Optional[str] = ..., num_requests: _Optional[int] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "seed_mode", "stop_token_ids", "ignore_eos", "repetition_penalty", "presence_penalty", "frequency_penalty", "min_tokens", "min_p", "logit_bias", "structured", "allowed_token_ids", "bad_words")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_MODE_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BAD_WORDS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    seed_mode: str
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    min_tokens: int
    min_p: float
    logit_bias: _containers.ScalarMap[int, float]
    structured: str
    allowed_token_ids: _containers.RepeatedScalarFieldContainer[int]
    bad_words: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed_mode: _Optional[str] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., repetition_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., min_tokens: _Optional[int] = ..., min_p: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., structured: _Optional[str] = ..., allowed_token_ids: _Optional[_Iterable[int]] = ..., bad_words: _Optional[_Iterable[str]] = ...) -> None: ...

class PregenSample(_message.Message):
    __slots__ = ("sample_index", "seed")
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    sample_index: int
    seed: int
    def __init__(self, sample_index: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class PregenPrompt(_message.Message):
    __slots__ = ("prompt_key", "prompt_token_ids", "max_new_tokens", "sampling", "samples", "step")
    PROMPT_KEY_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    prompt_key: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    max_new_tokens: int
    sampling: SamplingParams
    samples: _containers.RepeatedCompositeFieldContainer[PregenSample]
    step: int
    def __init__(self, prompt_key: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., max_new_tokens: _Optional[int] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., samples: _Optional[_Iterable[_Union[PregenSample, _Mapping]]] = ..., step: _Optional[int] = ...) -> None: ...

class PregenTask(_message.Message):
    __slots__ = ("prompt_key", "prompt_token_ids", "sample_index", "seed", "max_new_tokens", "sampling", "prefix_token_ids", "branch_at", "step", "hint_token_ids")
    PROMPT_KEY_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    PREFIX_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BRANCH_AT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    HINT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    prompt_key: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sample_index: int
    seed: int
    max_new_tokens: int
    sampling: SamplingParams
    prefix_token_ids: _containers.RepeatedScalarFieldContainer[int]
    branch_at: int
    step: int
    hint_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, prompt_key: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sample_index: _Optional[int] = ..., seed: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., prefix_token_ids: _Optional[_Iterable[int]] = ..., branch_at: _Optional[int] = ..., step: _Optional[int] = ..., hint_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class OpenStepRequest(_message.Message):
    __slots__ = ("step", "shards", "next_prompts", "pregen_window", "weight_version")
    STEP_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    PREGEN_WINDOW_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    step: int
    shards: _containers.RepeatedCompositeFieldContainer[ShardAssignment]
    next_prompts: _containers.RepeatedCompositeFieldContainer[PregenPrompt]
    pregen_window: PregenWindow
    weight_version: int
    def __init__(self, step: _Optional[int] = ..., shards: _Optional[_Iterable[_Union[ShardAssignment, _Mapping]]] = ..., next_prompts: _Optional[_Iterable[_Union[PregenPrompt, _Mapping]]] = ..., pregen_window: _Optional[_Union[PregenWindow, str]] = ..., weight_version: _Optional[int] = ...) -> None: ...

class OpenStepResponse(_message.Message):
    __slots__ = ("step", "num_tasks", "already_open", "opened_unix_s")
    STEP_FIELD_NUMBER: _ClassVar[int]
    NUM_TASKS_FIELD_NUMBER: _ClassVar[int]
    ALREADY_OPEN_FIELD_NUMBER: _ClassVar[int]
    OPENED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    step: int
    num_tasks: int
    already_open: bool
    opened_unix_s: float
    def __init__(self, step: _Optional[int] = ..., num_tasks: _Optional[int] = ..., already_open: _Optional[bool] = ..., opened_unix_s: _Optional[float] = ...) -> None: ...

class CloseStepRequest(_message.Message):
    __slots__ = ("step",)
    STEP_FIELD_NUMBER: _ClassVar[int]
    step: int
    def __init__(self, step: _Optional[int] = ...) -> None: ...

class CloseStepResponse(_message.Message):
    __slots__ = ("step", "closed_unix_s", "dropped_drafts", "dropped_tasks")
    STEP_FIELD_NUMBER: _ClassVar[int]
    CLOSED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    DROPPED_DRAFTS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_TASKS_FIELD_NUMBER: _ClassVar[int]
    step: int
    closed_unix_s: float
    dropped_drafts: int
    dropped_tasks: int
    def __init__(self, step: _Optional[int] = ..., closed_unix_s: _Optional[float] = ..., dropped_drafts: _Optional[int] = ..., dropped_tasks: _Optional[int] = ...) -> None: ...

class Flip(_message.Message):
    __slots__ = ("prompt_key", "sample_index", "at")
    PROMPT_KEY_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    prompt_key: str
    sample_index: int
    at: int
    def __init__(self, prompt_key: _Optional[str] = ..., sample_index: _Optional[int] = ..., at: _Optional[int] = ...) -> None: ...

class ReportDoneRequest(_message.Message):
    __slots__ = ("step", "rank_id", "flips")
    STEP_FIELD_NUMBER: _ClassVar[int]
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    FLIPS_FIELD_NUMBER: _ClassVar[int]
    step: int
    rank_id: str
    flips: _containers.RepeatedCompositeFieldContainer[Flip]
    def __init__(self, step: _Optional[int] = ..., rank_id: _Optional[str] = ..., flips: _Optional[_Iterable[_Union[Flip, _Mapping]]] = ...) -> None: ...

class ReportDoneResponse(_message.Message):
    __slots__ = ("stop", "pending_rank_ids", "step_over")
    STOP_FIELD_NUMBER: _ClassVar[int]
    PENDING_RANK_IDS_FIELD_NUMBER: _ClassVar[int]
    STEP_OVER_FIELD_NUMBER: _ClassVar[int]
    stop: bool
    pending_rank_ids: _containers.RepeatedScalarFieldContainer[str]
    step_over: bool
    def __init__(self, stop: _Optional[bool] = ..., pending_rank_ids: _Optional[_Iterable[str]] = ..., step_over: _Optional[bool] = ...) -> None: ...

class PollStopRequest(_message.Message):
    __slots__ = ("step", "rank_id")
    STEP_FIELD_NUMBER: _ClassVar[int]
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    step: int
    rank_id: str
    def __init__(self, step: _Optional[int] = ..., rank_id: _Optional[str] = ...) -> None: ...

class PollStopResponse(_message.Message):
    __slots__ = ("stop", "current_step", "pregen_over")
    STOP_FIELD_NUMBER: _ClassVar[int]
    CURRENT_STEP_FIELD_NUMBER: _ClassVar[int]
    PREGEN_OVER_FIELD_NUMBER: _ClassVar[int]
    stop: bool
    current_step: int
    pregen_over: bool
    def __init__(self, stop: _Optional[bool] = ..., current_step: _Optional[int] = ..., pregen_over: _Optional[bool] = ...) -> None: ...

class WatchStepRequest(_message.Message):
    __slots__ = ("step", "rank_id")
    STEP_FIELD_NUMBER: _ClassVar[int]
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    step: int
    rank_id: str
    def __init__(self, step: _Optional[int] = ..., rank_id: _Optional[str] = ...) -> None: ...

class StepEvent(_message.Message):
    __slots__ = ("kind", "step", "unix_s")
    KIND_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    UNIX_S_FIELD_NUMBER: _ClassVar[int]
    kind: StepEventKind
    step: int
    unix_s: float
    def __init__(self, kind: _Optional[_Union[StepEventKind, str]] = ..., step: _Optional[int] = ..., unix_s: _Optional[float] = ...) -> None: ...

class ClaimTasksRequest(_message.Message):
    __slots__ = ("step", "rank_id", "max_tasks", "tail_fill")
    STEP_FIELD_NUMBER: _ClassVar[int]
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_TASKS_FIELD_NUMBER: _ClassVar[int]
    TAIL_FILL_FIELD_NUMBER: _ClassVar[int]
    step: int
    rank_id: str
    max_tasks: int
    tail_fill: bool
    def __init__(self, step: _Optional[int] = ..., rank_id: _Optional[str] = ..., max_tasks: _Optional[int] = ..., tail_fill: _Optional[bool] = ...) -> None: ...

class ClaimTasksResponse(_message.Message):
    __slots__ = ("tasks", "target_step", "stop", "remaining", "in_progress", "branch_margin")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    TARGET_STEP_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    IN_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    BRANCH_MARGIN_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[PregenTask]
    target_step: int
    stop: bool
    remaining: int
    in_progress: int
    branch_margin: float
    def __init__(self, tasks: _Optional[_Iterable[_Union[PregenTask, _Mapping]]] = ..., target_step: _Optional[int] = ..., stop: _Optional[bool] = ..., remaining: _Optional[int] = ..., in_progress: _Optional[int] = ..., branch_margin: _Optional[float] = ...) -> None: ...

class Draft(_message.Message):
    __slots__ = ("prompt_key", "sample_index", "token_ids", "complete", "weight_version", "offset", "branch_at", "branch_offers", "margin_records", "token_ids_packed")
    PROMPT_KEY_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    BRANCH_AT_FIELD_NUMBER: _ClassVar[int]
    BRANCH_OFFERS_FIELD_NUMBER: _ClassVar[int]
    MARGIN_RECORDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_PACKED_FIELD_NUMBER: _ClassVar[int]
    prompt_key: str
    sample_index: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    complete: bool
    weight_version: int
    offset: int
    branch_at: int
    branch_offers: _containers.RepeatedCompositeFieldContainer[BranchOffer]
    margin_records: _containers.RepeatedCompositeFieldContainer[MarginRecord]
    token_ids_packed: bytes
    def __init__(self, prompt_key: _Optional[str] = ..., sample_index: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., complete: _Optional[bool] = ..., weight_version: _Optional[int] = ..., offset: _Optional[int] = ..., branch_at: _Optional[int] = ..., branch_offers: _Optional[_Iterable[_Union[BranchOffer, _Mapping]]] = ..., margin_records: _Optional[_Iterable[_Union[MarginRecord, _Mapping]]] = ..., token_ids_packed: _Optional[bytes] = ...) -> None: ...

class MarginRecord(_message.Message):
    __slots__ = ("at", "margin")
    AT_FIELD_NUMBER: _ClassVar[int]
    MARGIN_FIELD_NUMBER: _ClassVar[int]
    at: int
    margin: float
    def __init__(self, at: _Optional[int] = ..., margin: _Optional[float] = ...) -> None: ...

class BranchOffer(_message.Message):
    __slots__ = ("at", "token_id")
    AT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    at: int
    token_id: int
    def __init__(self, at: _Optional[int] = ..., token_id: _Optional[int] = ...) -> None: ...

class PushDraftsRequest(_message.Message):
    __slots__ = ("step", "rank_id", "drafts")
    STEP_FIELD_NUMBER: _ClassVar[int]
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    DRAFTS_FIELD_NUMBER: _ClassVar[int]
    step: int
    rank_id: str
    drafts: _containers.RepeatedCompositeFieldContainer[Draft]
    def __init__(self, step: _Optional[int] = ..., rank_id: _Optional[str] = ..., drafts: _Optional[_Iterable[_Union[Draft, _Mapping]]] = ...) -> None: ...

class PushDraftsResponse(_message.Message):
    __slots__ = ("statuses", "stored", "rejected", "message", "store_bytes", "budget_bytes")
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STORE_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[DraftStatus]
    stored: int
    rejected: int
    message: str
    store_bytes: int
    budget_bytes: int
    def __init__(self, statuses: _Optional[_Iterable[_Union[DraftStatus, str]]] = ..., stored: _Optional[int] = ..., rejected: _Optional[int] = ..., message: _Optional[str] = ..., store_bytes: _Optional[int] = ..., budget_bytes: _Optional[int] = ...) -> None: ...

class FetchDraftsRequest(_message.Message):
    __slots__ = ("step", "prompt_keys", "packed", "locate")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PROMPT_KEYS_FIELD_NUMBER: _ClassVar[int]
    PACKED_FIELD_NUMBER: _ClassVar[int]
    LOCATE_FIELD_NUMBER: _ClassVar[int]
    step: int
    prompt_keys: _containers.RepeatedScalarFieldContainer[str]
    packed: bool
    locate: bool
    def __init__(self, step: _Optional[int] = ..., prompt_keys: _Optional[_Iterable[str]] = ..., packed: _Optional[bool] = ..., locate: _Optional[bool] = ...) -> None: ...

class FetchDraftsResponse(_message.Message):
    __slots__ = ("drafts", "truncated", "located", "owners", "owner_addresses")
    DRAFTS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    LOCATED_FIELD_NUMBER: _ClassVar[int]
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    OWNER_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    drafts: _containers.RepeatedCompositeFieldContainer[Draft]
    truncated: bool
    located: _containers.RepeatedCompositeFieldContainer[LocatedDrafts]
    owners: _containers.RepeatedScalarFieldContainer[str]
    owner_addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, drafts: _Optional[_Iterable[_Union[Draft, _Mapping]]] = ..., truncated: _Optional[bool] = ..., located: _Optional[_Iterable[_Union[LocatedDrafts, _Mapping]]] = ..., owners: _Optional[_Iterable[str]] = ..., owner_addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class LocatedDrafts(_message.Message):
    __slots__ = ("prompt_key", "packed")
    PROMPT_KEY_FIELD_NUMBER: _ClassVar[int]
    PACKED_FIELD_NUMBER: _ClassVar[int]
    prompt_key: str
    packed: bytes
    def __init__(self, prompt_key: _Optional[str] = ..., packed: _Optional[bytes] = ...) -> None: ...

class Span(_message.Message):
    __slots__ = ("kind", "start_unix_s", "end_unix_s", "tokens")
    KIND_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    kind: SpanKind
    start_unix_s: float
    end_unix_s: float
    tokens: int
    def __init__(self, kind: _Optional[_Union[SpanKind, str]] = ..., start_unix_s: _Optional[float] = ..., end_unix_s: _Optional[float] = ..., tokens: _Optional[int] = ...) -> None: ...

class ReportSpansRequest(_message.Message):
    __slots__ = ("rank_id", "step", "spans")
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    rank_id: str
    step: int
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    def __init__(self, rank_id: _Optional[str] = ..., step: _Optional[int] = ..., spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ...) -> None: ...

class ReportSpansResponse(_message.Message):
    __slots__ = ("stored", "dropped")
    STORED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    stored: int
    dropped: int
    def __init__(self, stored: _Optional[int] = ..., dropped: _Optional[int] = ...) -> None: ...

class RankTimeline(_message.Message):
    __slots__ = ("rank_id", "spans", "done_unix_s")
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    DONE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    rank_id: str
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    done_unix_s: float
    def __init__(self, rank_id: _Optional[str] = ..., spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ..., done_unix_s: _Optional[float] = ...) -> None: ...

class StepTimeline(_message.Message):
    __slots__ = ("step", "opened_unix_s", "stop_unix_s", "closed_unix_s", "shards", "ranks")
    STEP_FIELD_NUMBER: _ClassVar[int]
    OPENED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    STOP_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    CLOSED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    step: int
    opened_unix_s: float
    stop_unix_s: float
    closed_unix_s: float
    shards: _containers.RepeatedCompositeFieldContainer[ShardAssignment]
    ranks: _containers.RepeatedCompositeFieldContainer[RankTimeline]
    def __init__(self, step: _Optional[int] = ..., opened_unix_s: _Optional[float] = ..., stop_unix_s: _Optional[float] = ..., closed_unix_s: _Optional[float] = ..., shards: _Optional[_Iterable[_Union[ShardAssignment, _Mapping]]] = ..., ranks: _Optional[_Iterable[_Union[RankTimeline, _Mapping]]] = ...) -> None: ...

class GetTimelineRequest(_message.Message):
    __slots__ = ("step",)
    STEP_FIELD_NUMBER: _ClassVar[int]
    step: int
    def __init__(self, step: _Optional[int] = ...) -> None: ...

class GetTimelineResponse(_message.Message):
    __slots__ = ("timeline", "kept_steps")
    TIMELINE_FIELD_NUMBER: _ClassVar[int]
    KEPT_STEPS_FIELD_NUMBER: _ClassVar[int]
    timeline: StepTimeline
    kept_steps: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, timeline: _Optional[_Union[StepTimeline, _Mapping]] = ..., kept_steps: _Optional[_Iterable[int]] = ...) -> None: ...

class RankInfo(_message.Message):
    __slots__ = ("rank_id", "address", "capacity", "state", "weight_version", "step", "done_step", "last_heartbeat_age_s")
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    DONE_STEP_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    rank_id: str
    address: str
    capacity: int
    state: RankState
    weight_version: int
    step: int
    done_step: int
    last_heartbeat_age_s: float
    def __init__(self, rank_id: _Optional[str] = ..., address: _Optional[str] = ..., capacity: _Optional[int] = ..., state: _Optional[_Union[RankState, str]] = ..., weight_version: _Optional[int] = ..., step: _Optional[int] = ..., done_step: _Optional[int] = ..., last_heartbeat_age_s: _Optional[float] = ...) -> None: ...

class DraftStoreStats(_message.Message):
    __slots__ = ("sequences", "tokens", "bytes", "budget_bytes")
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    sequences: int
    tokens: int
    bytes: int
    budget_bytes: int
    def __init__(self, sequences: _Optional[int] = ..., tokens: _Optional[int] = ..., bytes: _Optional[int] = ..., budget_bytes: _Optional[int] = ...) -> None: ...

class GetStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStateResponse(_message.Message):
    __slots__ = ("instance_id", "current_step", "step_open", "stopped", "ranks", "done_rank_ids", "pending_rank_ids", "queued_tasks", "claimed_tasks", "store")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    CURRENT_STEP_FIELD_NUMBER: _ClassVar[int]
    STEP_OPEN_FIELD_NUMBER: _ClassVar[int]
    STOPPED_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    DONE_RANK_IDS_FIELD_NUMBER: _ClassVar[int]
    PENDING_RANK_IDS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_TASKS_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_TASKS_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    current_step: int
    step_open: bool
    stopped: bool
    ranks: _containers.RepeatedCompositeFieldContainer[RankInfo]
    done_rank_ids: _containers.RepeatedScalarFieldContainer[str]
    pending_rank_ids: _containers.RepeatedScalarFieldContainer[str]
    queued_tasks: int
    claimed_tasks: int
    store: DraftStoreStats
    def __init__(self, instance_id: _Optional[str] = ..., current_step: _Optional[int] = ..., step_open: _Optional[bool] = ..., stopped: _Optional[bool] = ..., ranks: _Optional[_Iterable[_Union[RankInfo, _Mapping]]] = ..., done_rank_ids: _Optional[_Iterable[str]] = ..., pending_rank_ids: _Optional[_Iterable[str]] = ..., queued_tasks: _Optional[int] = ..., claimed_tasks: _Optional[int] = ..., store: _Optional[_Union[DraftStoreStats, _Mapping]] = ...) -> None: ...
