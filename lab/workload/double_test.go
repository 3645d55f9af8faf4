package workload

import (
	"slices"
	"testing"
)

func TestDoubleCharged(t *testing.T) {
	for _, tc := range []struct {
		name    string
		charges map[string]int
		want    []string
	}{
		{"none", nil, nil},
		{"once each", map[string]int{"m:a": 1, "m:b": 1, "m:c": 0}, nil},
		{"twice and thrice", map[string]int{"m:a": 1, "m:c": 3, "m:b": 2},
			[]string{"m:b (charged 2 times)", "m:c (charged 3 times)"}},
	} {
		if got := DoubleCharged(tc.charges); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
