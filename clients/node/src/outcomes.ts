/**
 * The typed outcomes: what `claim` and `lookup` answer (docs/api.md, "claim's outcomes"), and what
 * the transaction runner ends with. Each has a `kind` to switch on and is a class to test with
 * `instanceof`.
 */

/** The key was free: this transaction owns it. Write, `complete`, commit. */
export class Owner {
  readonly kind = 'owner' as const;
  constructor(
    /** When the key's replay window ends. */
    readonly replayDeadline: Date,
  ) {}
}

/** Same intent, window open: the stored answer, to send as it is. */
export class Replay {
  readonly kind = 'replay' as const;
  constructor(
    /** The stored status code. */
    readonly statusCode: number,
    /** The stored body, byte for byte the text `complete` returned. */
    readonly bodyText: string,
    /** The business object the key produced, if `complete` named one. */
    readonly resourceId: string | null,
    /** When the key's replay window ends. */
    readonly replayDeadline: Date,
  ) {}
}

/** The key was used for another intent (before or after expiry): nothing of its answer. */
export class KeyReused {
  readonly kind = 'key_reused' as const;
}

/** Same intent, window over: never executed again; the resource is to be looked up. */
export class Expired {
  readonly kind = 'expired' as const;
  constructor(
    /** The business object the key produced, if `complete` named one. */
    readonly resourceId: string | null,
    /** When the key's replay window ended. */
    readonly replayDeadline: Date,
    /** When the cleaner made the record a tombstone (null until it has). */
    readonly expiredAt: Date | null,
  ) {}
}

/** The owner's transaction committed with this answer (`complete`'s text). */
export class Completed {
  readonly kind = 'completed' as const;
  constructor(
    /** The status `complete` stored. */
    readonly statusCode: number,
    /** `complete`'s text: what every replay of the key sends. */
    readonly bodyText: string,
    /** The business object the key produced, if any. */
    readonly resourceId: string | null,
    /** When the key's replay window ends (null on a route whose key is optional and absent). */
    readonly replayDeadline: Date | null,
  ) {}
}

/**
 * The business write hit the business id's unique constraint (23505) under a new key, and the
 * existing object is this caller's same request: its answer, as a replay. The new key is not
 * recorded.
 */
export class ReplayByBusinessId {
  readonly kind = 'replay_by_business_id' as const;
  constructor(
    /** 200 unless the route's business-id hook says otherwise. */
    readonly statusCode: number,
    /** The existing object's answer text. */
    readonly bodyText: string,
    /** The existing object. */
    readonly resourceId: string | null,
  ) {}
}

/** The business id already names another request's object (23505): a conflict, naming nothing. */
export class DuplicateBusinessId {
  readonly kind = 'duplicate_business_id' as const;
}

/** What `claim` answers. */
export type ClaimOutcome = Owner | Replay | KeyReused | Expired;

/** What `lookup` answers for a committed record. */
export type LookupOutcome = Replay | KeyReused | Expired;

/** What the transaction runner ends with: each has its HTTP answer (`httpAnswer`). */
export type ExecuteOutcome =
  | Completed
  | Replay
  | KeyReused
  | Expired
  | ReplayByBusinessId
  | DuplicateBusinessId;
