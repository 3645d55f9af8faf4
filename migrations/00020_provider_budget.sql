-- +goose Up
-- The provider budget every process of a deployment shares (package
-- budget): one token bucket per name ('default': the one Stripe account),
-- whose rate is the fleet's requests per second to the provider. Workers
-- take small grants of tokens in one statement (provider_budget_take) and
-- spend them locally; a 429 lowers the rate (provider_budget_slow), once
-- per interval for the whole fleet, and it recovers additively towards the
-- configured ceiling. All times are the database's: the pods' clocks
-- never decide who may call.
--   rate       : tokens per second now; NULL while nothing limits the
--                fleet (no ceiling configured and no 429 seen);
--   ceiling    : PAYDEDUP_PROVIDER_RATE as the last process that took a
--                grant was configured; NULL for none;
--   tokens     : in the bucket at updated_at (at most rate × burst; a
--                new bucket starts full);
--   observed   : the grants' rate, an exponential average over 2 s: where
--                a first 429 without a ceiling starts lowering from;
--   not_before : the provider's Retry-After, for the whole fleet;
--   lowered_at : the last multiplicative decrease.
CREATE TABLE provider_budget (
    name       text             PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 64),
    rate       double precision CHECK (rate > 0),
    ceiling    double precision CHECK (ceiling > 0),
    tokens     double precision NOT NULL DEFAULT 0,
    observed   double precision NOT NULL DEFAULT 0 CHECK (observed >= 0),
    not_before timestamptz,
    lowered_at timestamptz,
    updated_at timestamptz      NOT NULL
);

-- +goose StatementBegin
-- provider_budget_take grants up to want tokens of the bucket name, after
-- refilling it for the time since its last grant and letting its rate
-- recover by increase per second. It returns the tokens granted (0 when
-- none is free, or the fleet must wait for a Retry-After), the rate, and
-- how long to wait before asking again when it granted none.
CREATE FUNCTION provider_budget_take(p_name text, p_want double precision, p_ceiling double precision,
        p_increase double precision, p_burst double precision, p_now timestamptz)
    RETURNS TABLE (granted double precision, rate double precision, retry_in double precision)
    LANGUAGE plpgsql AS $$
DECLARE
    b  provider_budget%ROWTYPE;
    t  timestamptz := coalesce(p_now, now());
    dt double precision;
    cap double precision;
BEGIN
    INSERT INTO provider_budget (name, rate, ceiling, tokens, updated_at)
        VALUES (p_name, p_ceiling, p_ceiling, coalesce(greatest(1, p_ceiling * p_burst), 0), t)
        ON CONFLICT (name) DO NOTHING;
    SELECT * INTO b FROM provider_budget WHERE name = p_name FOR UPDATE;
    dt := greatest(0, extract(epoch FROM t - b.updated_at));
    b.ceiling := p_ceiling;
    IF b.rate IS NOT NULL THEN
        b.rate := b.rate + p_increase * dt;
    ELSIF p_ceiling IS NOT NULL THEN
        b.rate := p_ceiling;
    END IF;
    IF p_ceiling IS NOT NULL THEN
        b.rate := least(b.rate, p_ceiling);
    END IF;
    b.observed := b.observed * exp(-dt / 2.0);
    granted := 0;
    retry_in := 0;
    IF b.not_before IS NOT NULL AND t < b.not_before THEN
        retry_in := extract(epoch FROM b.not_before - t);
    ELSIF b.rate IS NULL THEN
        granted := p_want;
    ELSE
        cap := greatest(1, b.rate * p_burst);
        b.tokens := least(cap, b.tokens + b.rate * dt);
        granted := least(p_want, floor(b.tokens));
        IF granted < 1 THEN
            granted := 0;
            retry_in := (1 - b.tokens) / b.rate;
        END IF;
        b.tokens := b.tokens - granted;
    END IF;
    b.observed := b.observed + granted / 2.0;
    UPDATE provider_budget SET rate = b.rate, ceiling = b.ceiling, tokens = b.tokens, observed = b.observed,
        updated_at = greatest(b.updated_at, t)
        WHERE name = p_name;
    rate := b.rate;
    RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- provider_budget_slow records a 429 of the bucket name: when lower and no
-- decrease happened within interval seconds, the rate becomes factor times
-- itself (or the observed rate, when nothing limited the fleet yet), never
-- under floor; a retry_after (seconds, 0 for none) keeps the whole fleet
-- from calling until then. It returns the rate and whether it lowered it.
CREATE FUNCTION provider_budget_slow(p_name text, p_lower boolean, p_factor double precision, p_interval double precision,
        p_floor double precision, p_retry_after double precision, p_now timestamptz)
    RETURNS TABLE (rate double precision, lowered boolean)
    LANGUAGE plpgsql AS $$
DECLARE
    b provider_budget%ROWTYPE;
    t timestamptz := coalesce(p_now, now());
BEGIN
    INSERT INTO provider_budget (name, updated_at) VALUES (p_name, t) ON CONFLICT (name) DO NOTHING;
    SELECT * INTO b FROM provider_budget WHERE name = p_name FOR UPDATE;
    lowered := false;
    IF p_lower AND (b.lowered_at IS NULL OR t >= b.lowered_at + make_interval(secs => p_interval)) THEN
        b.rate := greatest(p_floor, coalesce(b.rate, greatest(b.observed, p_floor)) * p_factor);
        b.tokens := least(b.tokens, greatest(1, b.rate));
        b.lowered_at := t;
        lowered := true;
    END IF;
    IF p_retry_after > 0 THEN
        b.not_before := greatest(coalesce(b.not_before, t), t + make_interval(secs => p_retry_after));
    END IF;
    UPDATE provider_budget SET rate = b.rate, tokens = b.tokens, lowered_at = b.lowered_at, not_before = b.not_before
        WHERE name = p_name;
    rate := b.rate;
    RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- Only the worker role (the worker, its reconciler, audit and reconcile
-- run as it) takes from the budget; the gateway never calls the provider.
REVOKE ALL ON FUNCTION provider_budget_take(text, double precision, double precision, double precision, double precision, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION provider_budget_slow(text, boolean, double precision, double precision, double precision, double precision, timestamptz) FROM PUBLIC;
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'paydedup_worker') THEN
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON TABLE %I.provider_budget TO paydedup_worker', current_schema());
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.provider_budget_take(text, double precision, double precision, double precision, double precision, timestamptz) TO paydedup_worker', current_schema());
        EXECUTE format('GRANT EXECUTE ON FUNCTION %I.provider_budget_slow(text, boolean, double precision, double precision, double precision, double precision, timestamptz) TO paydedup_worker', current_schema());
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The bucket is only the fleet's pace; the next take starts a new one.
DROP FUNCTION provider_budget_slow(text, boolean, double precision, double precision, double precision, double precision, timestamptz);
DROP FUNCTION provider_budget_take(text, double precision, double precision, double precision, double precision, timestamptz);
DROP TABLE provider_budget;
