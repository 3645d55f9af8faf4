package ledger

// Lifecycle is what moved a payment after its own outcome, as the rows
// that record it hold them: its ledger row (a capture moves an authorized
// one to succeeded with what it received, a cancel to canceled), its
// captures and cancels, and its refunds. The gateway's GET and the
// console read it through the same store reads (the gateway store's
// PaymentLife, OpsOf and RefundsOf) and show it by Life.
type Lifecycle struct {
	// LedgerStatus is the payment's ledger row's status (PaymentSucceeded,
	// PaymentCanceled, authorized...); empty when it has none.
	LedgerStatus string
	// AmountReceived is what a capture received (0 when none).
	AmountReceived int64
	// Ops are its captures and cancels, oldest first (refused ones too).
	Ops []PaymentOp
	// Refunds are its refunds, oldest first, the first the read lists;
	// RefundsTotal counts them all and AmountRefunded sums, over them all,
	// the succeeded ones and those the provider holds pending (Stripe's
	// amount_refunded).
	Refunds        []Refund
	RefundsTotal   int
	AmountRefunded int64
}

// Life is a payment's state once its lifecycle is applied: the words and
// amounts the HTTP API and the console show.
type Life struct {
	// Status is the payment's status: st's, moved by a capture
	// (succeeded) or a cancel (canceled), and a succeeded payment's
	// refunded or partially_refunded once refunds of it hold money.
	Status string
	// AmountCapturable is set while authorized; AmountReceived once
	// authorized or succeeded; AmountRefunded once succeeded.
	AmountCapturable, AmountReceived, AmountRefunded *int64
}

// The statuses a succeeded payment shows once refunds of it succeeded (or
// are held pending by the provider): all of its amount, or part of it.
const (
	StatusRefunded          = "refunded"
	StatusPartiallyRefunded = "partially_refunded"
)

// LifeOf applies l to the payment in state st (StateOf): an authorized
// payment moves to where its ledger row stands (succeeded once captured,
// with what the capture received; canceled once canceled), and a
// succeeded one counts its refunds.
func LifeOf(st PaymentState, l Lifecycle) Life {
	life := Life{Status: string(st.Status)}
	switch st.Status {
	case StateAuthorized:
		capturable, received := st.AmountCapturable, int64(0)
		life.AmountCapturable, life.AmountReceived = &capturable, &received
		switch l.LedgerStatus {
		case PaymentSucceeded:
			received := l.AmountReceived
			life.Status, life.AmountCapturable, life.AmountReceived = string(StateSucceeded), nil, &received
		case PaymentCanceled:
			life.Status, life.AmountCapturable = PaymentCanceled, nil
		}
	case StateSucceeded:
		received := st.Amount
		life.AmountReceived = &received
	}
	if life.Status != string(StateSucceeded) {
		return life
	}
	refunded := l.AmountRefunded
	life.AmountRefunded = &refunded
	switch {
	case refunded > 0 && refunded >= *life.AmountReceived:
		life.Status = StatusRefunded
	case refunded > 0:
		life.Status = StatusPartiallyRefunded
	}
	return life
}

// KindCounts are one kind's rows by status (the statuses of its table:
// a payment's key pending, completed or failed; a refund's, a capture's
// or a cancel's pending, unknown, processing, succeeded, failed,
// refused), and how many of them are stuck: a payment's key pending for
// longer than the grace (as Stats.Stuck), an operation pending past its
// lease (its holder is gone; the reconciler takes it up).
type KindCounts struct {
	ByStatus map[string]int64
	Stuck    int64
}

// KindStats are the store's rows by kind (payment.KindCharge,
// KindAuthorize, KindRefund, KindCapture, KindCancel), every status of
// each kind present, zero or not; and Authorized, what the ledger holds
// of authorizations: still authorized (the money held), captured
// (succeeded with an amount received) and canceled.
type KindStats struct {
	Kinds      map[string]KindCounts
	Authorized map[string]int64
}

// UnsettledOps are one kind's operations (refunds, captures or cancels)
// an operator alerts on, cheap enough to read on every metrics scrape:
// Stuck, pending past its lease (its holder is gone), and Unknown, a
// call's answer lost (looked up before any re-call). Both resolve when
// the reconciler's lookup answers: staying above 0 means it does not.
type UnsettledOps struct {
	Stuck, Unknown int64
}
