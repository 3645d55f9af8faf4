package redact

// ContainsPAN reports whether s holds something that looks like a card number.
func ContainsPAN(s string) bool { return PANs(s) != s }
