package console

import "github.com/paydedup/paydedup/internal/redact"

// Card data never reaches a page. A payment command carries only a payment
// method token (payment_method: "pm_..."), but a dead letter is whatever a
// publisher sent (a card number in the metadata, in a malformed body), and
// a stored provider answer may hold a payment method object with a card's
// last four digits, expiry and fingerprint. So every text shown from a
// message or an answer goes through Redact, and every body through
// redact.ShownBody, the policy dlq show follows too.

// Redact masks every card number in s (redact.PANs): every window of 13
// to 19 digits of a run of digits joined by anything but letters, from a
// group's start to a group's end, with a card brand's prefix and length
// and passing Luhn.
func Redact(s string) string { return redact.PANs(s) }

// shown is a one-line field from a message or an answer as a page shows
// it: card numbers masked, control bytes escaped as dlq show does.
func shown(s string) string { return redact.Shown(s, false) }
