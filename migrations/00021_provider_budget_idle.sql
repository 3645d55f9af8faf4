-- +goose Up
-- provider_budget_take (migration 00020) decayed the bucket's observed
-- rate by exp(-dt / 2) over the time since its last grant; past about
-- 25 minutes without one (exp(-745)), PostgreSQL's exp underflows ("value out of
-- range: underflow"), the statement fails, the row is never updated, and
-- every grant after it failed: once the fleet had been idle that long,
-- every process paced itself alone for good. The decay now stops at ten
-- minutes, where it is nothing already.
-- And without a ceiling (PAYDEDUP_PROVIDER_RATE unset) a learned rate
-- recovered by increase per second without bound, used or not: ten quiet
-- minutes after a 429 at 20/s it stood at 1214/s. It now recovers only
-- while the fleet's observed rate is at least half of it (as TCP grows
-- no window it does not use, RFC 7661). Privileges are kept by CREATE OR
-- REPLACE.
-- +goose StatementBegin
-- provider_budget_take grants up to want tokens of the bucket name, after
-- refilling it for the time since its last grant and letting its rate
-- recover by increase per second. It returns the tokens granted (0 when
-- none is free, or the fleet must wait for a Retry-After), the rate, and
-- how long to wait before asking again when it granted none.
CREATE OR REPLACE FUNCTION provider_budget_take(p_name text, p_want double precision, p_ceiling double precision,
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
    -- Past ten minutes the decay is nothing; exp(-dt / 2) itself
    -- underflows, an error, past about twenty-five.
    b.observed := b.observed * exp(-least(dt, 600) / 2.0);
    IF b.rate IS NOT NULL THEN
        -- Without a ceiling only the provider's 429s bound the rate: it
        -- recovers only while the fleet uses at least half of it, or it
        -- would climb without bound while the fleet is quiet and send
        -- the next burst at whatever it reached.
        IF p_ceiling IS NOT NULL OR 2 * b.observed >= b.rate THEN
            b.rate := b.rate + p_increase * dt;
        END IF;
    ELSIF p_ceiling IS NOT NULL THEN
        b.rate := p_ceiling;
    END IF;
    IF p_ceiling IS NOT NULL THEN
        b.rate := least(b.rate, p_ceiling);
    END IF;
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

-- +goose Down
-- +goose StatementBegin
-- provider_budget_take grants up to want tokens of the bucket name, after
-- refilling it for the time since its last grant and letting its rate
-- recover by increase per second. It returns the tokens granted (0 when
-- none is free, or the fleet must wait for a Retry-After), the rate, and
-- how long to wait before asking again when it granted none.
CREATE OR REPLACE FUNCTION provider_budget_take(p_name text, p_want double precision, p_ceiling double precision,
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
