-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE VIEW tombstoned.idempotency_cards AS
 SELECT s.tenant_id,
    s.principal_id,
    s.operation,
    r.idempotency_key,
    r.fingerprint,
    r.status_code,
    r.response_body,
    r.order_id,
    r.expired,
    r.created_at,
    r.replay_deadline,
    r.expired_at,
    r.resource_id,
    r.scope_id
   FROM tombstoned.idempotency_records r
     JOIN tombstoned.idempotency_scopes s USING (scope_id);

-- ACL: default (the owner only)
