// Package redact hides secrets and card data in what paydedup prints: the
// user information of server URLs, which may carry a password or a token;
// card numbers in dead letters and stored provider answers; and the control
// bytes of text from a message, which could drive a terminal.
package redact

import "strings"

// URLs hides the user information (a password, or a token) of every URL in
// a comma-separated server list, such as NATS_URL.
func URLs(list string) string {
	parts := strings.Split(list, ",")
	for i, u := range parts {
		if at := strings.LastIndex(u, "@"); at >= 0 {
			start := 0
			if j := strings.Index(u, "://"); j >= 0 && j < at {
				start = j + 3
			}
			parts[i] = u[:start] + "***" + u[at:]
		}
	}
	return strings.Join(parts, ",")
}
