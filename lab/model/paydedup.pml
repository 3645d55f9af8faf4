/*
 * paydedup's payment protocol for one (merchant_id, idempotency_key), as the
 * code implements it: claim, lease, fence, provider call, complete, ack,
 * redelivery, the reconciler, the MAX_DELIVERIES net and dead-letter replay.
 * README.md beside this file maps every step to the Go function that
 * implements it. Checked by `go test ./model` (spin -a, gcc, pan).
 *
 * Bounds: NW workers, MAXDEL deliveries per message, two published copies of
 * the command plus one replay of a dead letter, MAXCRASH process deaths in
 * all, MAXLOOKUPERR failed reconciler lookups. Time is not counted; every
 * timed event (a lease running out, SearchLag passing, the key window
 * passing, the provider forgetting a key, a charge reaching search) is a
 * nondeterministic step of Env, allowed only when the configuration rules
 * the code enforces at start-up say it can happen (see README.md).
 *
 * Switches (spin -D...): each puts back one bug the code has been fixed of.
 *   BUG_409     a 409 idempotency_key_in_use is read as "not charged"
 *               (ClassRetryable): the row is marked failed (Store.Fail).
 *   BUG_WINDOW  a failed row past its key window is re-acquired and called
 *               blind instead of parked for a lookup (claimSQL/parkSQL).
 *   BUG_NOLAG   the reconciler leases a stuck row as soon as its lease
 *               expired, without waiting SearchLag (AcquireStuck's grace).
 *   NO_FAILED_INV  do not check "a failed row has no charge", so that the
 *               checker must reach the double charge itself.
 */

#ifndef NW
#define NW 2
#endif
#ifndef MAXDEL
#define MAXDEL 2
#endif
#ifndef MAXCRASH
#define MAXCRASH 2
#endif
#ifndef MAXLOOKUPERR
#define MAXLOOKUPERR 1
#endif
#define NMSG 3          /* 0: the command; 1: a duplicate publish; 2: a replay */
#define RH (NW + 1)     /* the reconciler's holder id; workers are 1..NW */

/* idempotency_keys.status; S_NONE: no row yet */
#define S_NONE      0
#define S_PENDING   1
#define S_COMPLETED 2
#define S_FAILED    3

/* the provider's idempotency record for the row's provider key */
#define P_NONE     0    /* none, or forgotten (past the provider's 24 h) */
#define P_INFLIGHT 1    /* a request under the key is executing */
#define P_CHARGED  2    /* executed and charged: a new request replays it */

/* a JetStream message */
#define M_UNPUB     0
#define M_READY     1   /* in the stream, deliverable */
#define M_HELD      2   /* delivered to a worker, not yet settled */
#define M_ACKED     3
#define M_TERMED    4   /* dead-lettered by the worker, then Term */
#define M_EXHAUSTED 5   /* ran out of deliveries unsettled: advisory stored */
#define M_DEAD      6   /* the net filed its dead letter */

/* claim outcomes (dedup.Outcome) and processing results (consumer.Kind) */
#define R_CLAIMED   1   /* Claimed or Reacquired: the lease is ours */
#define R_DUP       2   /* Duplicate: completed already */
#define R_INFLIGHT  3   /* InFlight: a live lease */
#define R_LOOKUP    4   /* NeedsLookup: past the key window */
#define R_COMPLETED 5
#define R_RETRY     6

/* the provider's answer to one call (ChargeWithRetry) */
#define A_CHARGED   1   /* an Outcome, fresh or replayed */
#define A_UNKNOWN   2   /* timeout, connection dropped: ClassUnknown */
#define A_INUSE     3   /* 409 idempotency_key_in_use: ClassUnknown */
#define A_RETRYABLE 4   /* 429, refused dial: provably not executed */

/* the row */
byte status = S_NONE;
byte lockedBy = 0;
byte attempts = 0;
bool expired = false;   /* locked_until has passed */
bool aged = false;      /* ... more than max(Grace, SearchLag) ago */
bool maybe = false;     /* maybe_charged */
bool wold = false;      /* key_window_start is older than the key window */
bool ledger = false;    /* the payments ledger row */

/* the provider */
byte prec = P_NONE;
bool pinwin = false;    /* prec was made inside the row's current key window */
byte charges = 0;       /* charges made under this (merchant, key), ever */
bool visible = false;   /* the latest charge shows in the provider's search */

/* the streams */
byte mst[NMSG];
byte mdel[NMSG];        /* NumDelivered */
bool letter[NMSG];      /* a dead letter of this message is in PAYMENTS_DLQ */
bool replayed = false;

bool presend[NW + 2];   /* worker holds a fresh claim, provider call not sent */
byte crashes = 0;
byte lookupErrs = 0;

/* the fence every write after the claim carries (dedup's `fenced`) */
#define fenced(h, a) (status == S_PENDING && lockedBy == h && attempts == a)

/* the row becomes completed with its ledger row (one transaction); the
 * lease columns no longer matter and are cleared, which keeps the state
 * space small */
inline completed() {
	status = S_COMPLETED; ledger = true;
	lockedBy = 0; attempts = 0; expired = false; aged = false; maybe = false; wold = false;
	visible = true;   /* only a lookup of a pending row reads it */
	if
	:: prec == P_CHARGED -> prec = P_NONE; pinwin = false   /* never called again */
	:: else -> skip
	fi
}

/* Store.Release: unknown outcome; the row stays pending, maybe_charged. */
inline release(h, a) {
	if
	:: fenced(h, a) ->
		maybe = true;
		if
		:: !expired -> expired = true; aged = false
		:: else -> skip   /* least(locked_until, now) keeps an older end */
		fi
	:: else -> skip   /* ErrLeaseLost: changes nothing */
	fi
}

/* Store.Fail: known not charged; failed unless an earlier call may have. */
inline fail(h, a) {
	if
	:: fenced(h, a) && maybe -> expired = true; aged = false
	:: fenced(h, a) && !maybe -> status = S_FAILED; expired = true; aged = false
	:: else -> skip
	fi
}

proctype Worker(byte me) {
	byte m, res, att, ans;
end_idle:
	do
	:: atomic {
		/* Worker.fetch: one deliverable message (JetStream's redelivery
		 * after a nak or AckWait is the same: the message is READY) */
		if
		:: mst[0] == M_READY -> m = 0
		:: mst[1] == M_READY -> m = 1
		:: mst[2] == M_READY -> m = 2
		fi;
		mst[m] = M_HELD; mdel[m]++;
		printf("W%d fetch msg %d (delivery %d)\n", me, m, mdel[m])
	   }
		if :: crashes < MAXCRASH -> goto crash :: skip fi;

		atomic {
		/* Store.ClaimBatch (claimSQL, evaluate, parkSQL): one committed
		 * transaction */
		if
		:: status == S_NONE ->
			status = S_PENDING; attempts = 1; lockedBy = me; expired = false; aged = false;
			maybe = false; wold = false; res = R_CLAIMED
		:: status == S_COMPLETED -> res = R_DUP
		:: status == S_PENDING && !expired -> res = R_INFLIGHT
		:: status == S_PENDING && expired && !wold ->
			attempts++; lockedBy = me; maybe = true; expired = false; aged = false; res = R_CLAIMED
		:: status == S_PENDING && expired && wold -> res = R_LOOKUP
		:: status == S_FAILED && !wold ->
			status = S_PENDING; attempts++; lockedBy = me; expired = false; aged = false; res = R_CLAIMED
		:: status == S_FAILED && wold ->
#ifdef BUG_WINDOW
			status = S_PENDING; attempts++; lockedBy = me; expired = false; aged = false; res = R_CLAIMED
#else
			/* parked for a lookup: pending, expired now, maybe_charged */
			status = S_PENDING; attempts++; lockedBy = me; expired = true; aged = false;
			maybe = true; res = R_LOOKUP
#endif
		fi;
		att = attempts;
		presend[me] = (res == R_CLAIMED);
		printf("W%d claim -> %d (status %d attempt %d)\n", me, res, status, att)
		}
		if :: crashes < MAXCRASH -> goto crash :: skip fi;

		if
		:: res == R_CLAIMED ->
			atomic {
			/* Processor.charge -> provider.ChargeWithRetry: the call is
			 * sent while the lease is live (lease > call timeout x tries;
			 * the heartbeat holds it during the slot wait) */
			presend[me] = false;
			if
			:: prec == P_NONE ->
				prec = P_INFLIGHT; pinwin = true;
				if
				:: prec = P_CHARGED; charges++; visible = false; ans = A_CHARGED
				:: prec = P_CHARGED; charges++; visible = false; ans = A_UNKNOWN /* answer lost */
				:: ans = A_UNKNOWN  /* still executing; our call timed out */
				:: ans = A_INUSE    /* net/http resent it and met its first copy */
				fi
			:: prec == P_INFLIGHT -> ans = A_INUSE
			:: prec == P_CHARGED -> ans = A_CHARGED   /* Idempotent-Replayed */
			:: ans = A_RETRYABLE                      /* 429 / refused dial */
			fi;
			printf("W%d call -> answer %d (charges %d)\n", me, ans, charges)
			}
			if :: crashes < MAXCRASH -> goto crash :: skip fi;

			atomic {
			/* record the outcome under the fence */
			if
			:: ans == A_CHARGED ->
				/* committer.Complete -> Store.CompleteBatch */
				if
				:: fenced(me, att) -> completed(); res = R_COMPLETED
				:: else -> res = R_RETRY   /* ErrLeaseLost */
				fi
			:: ans == A_RETRYABLE -> fail(me, att); res = R_RETRY
			:: ans == A_UNKNOWN -> release(me, att); res = R_RETRY
			:: ans == A_INUSE ->
#ifdef BUG_409
				fail(me, att);
#else
				release(me, att);
#endif
				res = R_RETRY
			fi;
			printf("W%d record -> %d (status %d)\n", me, res, status)
			}
			if :: crashes < MAXCRASH -> goto crash :: skip fi
		:: else -> skip
		fi;

		/* Worker.settle by decide */
		if
		:: res == R_COMPLETED || res == R_DUP ->
			atomic {
			assert(status == S_COMPLETED);   /* acked only after the commit */
			mst[m] = M_ACKED;
			printf("W%d ack msg %d\n", me, m)
			}
		:: res != R_COMPLETED && res != R_DUP && mdel[m] < MAXDEL ->
			atomic { mst[m] = M_READY; printf("W%d nak msg %d\n", me, m) }
		:: res != R_COMPLETED && res != R_DUP && mdel[m] >= MAXDEL ->
			/* last delivery: fileDeadLetter (PubAck), then Term */
			atomic { letter[m] = true; printf("W%d dead-letter msg %d\n", me, m) }
			if :: crashes < MAXCRASH -> goto crash :: skip fi;
			mst[m] = M_TERMED
		fi;
		m = 0; res = 0; att = 0; ans = 0;   /* forget the message */
		goto end_idle;
crash:
		atomic {
			/* the process dies; its message comes back after AckWait,
			 * or, out of deliveries, raises the MAX_DELIVERIES advisory */
			crashes++;
			presend[me] = false;
			if
			:: mdel[m] >= MAXDEL -> mst[m] = M_EXHAUSTED
			:: else -> mst[m] = M_READY
			fi;
			printf("W%d CRASH holding msg %d\n", me, m);
			m = 0; res = 0; att = 0; ans = 0
		}
	od
}

/* Reconciler.RunOnce: AcquireStuck, resolve (Lookup, then ResolveNotCharged,
 * Complete or DeferLookup). Its crash lets its lease lapse. */
active proctype Reconciler() {
	byte att;
	bool found;
end_idle:
	do
	:: atomic {
#ifdef BUG_NOLAG
		status == S_PENDING && expired ->
#else
		status == S_PENDING && expired && aged ->
#endif
		attempts++; lockedBy = RH; expired = false; aged = false; maybe = true;
		att = attempts;
		printf("R acquire (attempt %d)\n", att)
	   }
		if :: crashes < MAXCRASH -> goto crash :: skip fi;
		/* Lookup: search by metadata; it sees a charge once indexed */
		if
		:: lookupErrs < MAXLOOKUPERR ->
			atomic {
			lookupErrs++;
			printf("R lookup error -> DeferLookup\n");
			release(RH, att);   /* DeferLookup: released, backed off */
			att = 0
			}
			goto end_idle
		:: atomic { charges > 0 && visible -> found = true; printf("R lookup: found\n") }
		:: atomic { !(charges > 0 && visible) -> found = false; printf("R lookup: not found\n") }
		fi;
		if :: crashes < MAXCRASH -> goto crash :: skip fi;
		atomic {
		if
		:: found && fenced(RH, att) -> completed();
			printf("R complete\n")
		:: !found && fenced(RH, att) ->
			/* ResolveNotCharged: failed, a fresh key window */
			status = S_FAILED; expired = true; aged = false; maybe = false; wold = false;
			pinwin = false;   /* the provider's record (if any) predates it */
			printf("R resolve not charged\n")
		:: else -> printf("R lease lost\n")
		fi
		}
		att = 0; found = false;
		goto end_idle;
crash:
		atomic { crashes++; att = 0; found = false; printf("R CRASH\n") }
	od
}

/* RunMaxDeliveriesNet: the advisory is kept in a stream until its dead
 * letter is filed (the letter's Nats-Msg-Id makes a second filing a no-op). */
active proctype Net() {
end_idle:
	do
	:: atomic { mst[0] == M_EXHAUSTED -> letter[0] = true; mst[0] = M_DEAD; printf("net files msg 0\n") }
	:: atomic { mst[1] == M_EXHAUSTED -> letter[1] = true; mst[1] = M_DEAD; printf("net files msg 1\n") }
	:: atomic { mst[2] == M_EXHAUSTED -> letter[2] = true; mst[2] = M_DEAD; printf("net files msg 2\n") }
	od
}

/* after the incident: no copy of the command is in flight */
#define QUIET (mst[0] != M_READY && mst[0] != M_HELD && mst[1] != M_READY && mst[1] != M_HELD)

inline replay() {
	mst[2] = M_READY; mdel[2] = 0; replayed = true;
	printf("replay letter of msg %d as msg 2\n", i)
}

/* dlq.Replay of one dead letter (an operator, at any time): republish with
 * a new Nats-Msg-Id, then delete the letter; it may die in between. */
active proctype Operator() {
	byte i = 255;
end_idle:
	if
#ifndef NOREPLAY
	:: atomic { QUIET && letter[0] -> i = 0; replay() }
	:: atomic { QUIET && letter[1] -> i = 1; replay() }
#endif
	:: skip   /* or never */
	fi;
	if
	:: i != 255 -> letter[i] = false
	:: skip   /* died before the delete: the letter stays */
	fi
}

/* Time, the provider's own progress, and the client's duplicate publish. */
active proctype Env() {
end_idle:
	do
	/* a lease runs out (its heartbeat failed, its holder is slow or dead),
	 * except between a claim and its call (the nesting rule) */
	:: atomic { status == S_PENDING && !expired && !presend[lockedBy] ->
		expired = true; printf("lease of %d expires\n", lockedBy) }
	/* max(Grace, SearchLag) passes after the lease's end; SearchLag covers
	 * the provider finishing a request after its caller gave up, and its
	 * search index lag */
	:: atomic { status == S_PENDING && expired && !aged && prec != P_INFLIGHT &&
		(charges == 0 || visible) -> aged = true; printf("stuck past SearchLag\n") }
	/* the key window (24 h minus a margin) passes, except between a claim
	 * and its call (the margin exceeds the lease) */
	:: atomic { (status == S_FAILED || status == S_PENDING && !presend[lockedBy]) && !wold ->
		wold = true; printf("key window passes\n") }
	/* the provider finishes a request under the key and charges */
	:: atomic { prec == P_INFLIGHT -> prec = P_CHARGED; charges++; visible = false;
		printf("provider charges (charges %d)\n", charges) }
	/* the charge reaches the provider's search */
	:: atomic { charges > 0 && !visible -> visible = true; printf("charge searchable\n") }
	/* the provider forgets the key, 24 h after the record was made: never
	 * before the row's key window (shorter) passes */
	:: atomic { prec == P_CHARGED && (!pinwin || wold) -> prec = P_NONE; pinwin = false;
		printf("provider forgets the key\n") }
	od
}

/* Safety: checked in every reachable state. */
active proctype Invariants() {
end_idle:
	if
	:: atomic { charges > 1 -> assert(charges <= 1) }   /* never two charges */
#ifndef NO_FAILED_INV
	:: atomic { status == S_FAILED && charges > 0 ->
		assert(!(status == S_FAILED && charges > 0)) }    /* failed: no charge */
#endif
	:: atomic { status == S_COMPLETED && !(ledger && charges == 1) ->
		assert(status != S_COMPLETED || (ledger && charges == 1)) } /* completed: its ledger row, its charge */
	fi
}

/* Progress: every execution is finite (the bounds); in every final state
 * each message is settled, the row is not left pending, and the command is
 * completed or dead-lettered. */
active proctype Final() {
	timeout ->
	assert(mst[0] == M_ACKED || mst[0] == M_TERMED || mst[0] == M_DEAD);
	assert(mst[1] == M_ACKED || mst[1] == M_TERMED || mst[1] == M_DEAD);
	assert(mst[2] == M_ACKED || mst[2] == M_TERMED || mst[2] == M_DEAD || (mst[2] == M_UNPUB && !replayed));
	assert(status != S_PENDING);
	assert(status == S_COMPLETED || letter[0] || letter[1] || letter[2])
}

init {
	byte w = 1;
	atomic {
		/* the command, and the client's second publish of it after the
		 * stream's duplicate window */
		mst[0] = M_READY; mst[1] = M_READY;
		do
		:: w <= NW -> run Worker(w); w++
		:: else -> break
		od
	}
}
