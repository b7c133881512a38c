package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestRoundsRunInABBAOrder checks measure's order: two contenders run
// A B, B A, B A, A B; with more, every pair of rounds is a palindrome,
// and every contender runs first in some round.
func TestRoundsRunInABBAOrder(t *testing.T) {
	t.Parallel()
	var got []string
	for r := range 4 {
		got = append(got, strings.Join(roundOrder([]string{"A", "B"}, r), " "))
	}
	if diff := cmp.Diff([]string{"A B", "B A", "B A", "A B"}, got); diff != "" {
		t.Errorf("two contenders' rounds (-want +got):\n%s", diff)
	}
	cs := []string{"A", "B", "C"}
	first := map[string]bool{}
	for r := 0; r < 6; r += 2 {
		even, odd := roundOrder(cs, r), roundOrder(cs, r+1)
		back := slices.Clone(odd)
		slices.Reverse(back)
		if !slices.Equal(even, back) {
			t.Errorf("rounds %d and %d are no palindrome: %v then %v", r, r+1, even, odd)
		}
		first[even[0]] = true
	}
	if len(first) != len(cs) {
		t.Errorf("contenders that ran first in a pair: %v, want all of %v", first, cs)
	}
}

// TestPairedRatioComparesRoundByRound checks that the ratio is taken
// within each round: a round that is slow for both contenders gives the
// same ratio as a fast one.
func TestPairedRatioComparesRoundByRound(t *testing.T) {
	t.Parallel()
	s := samples{
		"a": {1 * time.Second, 2 * time.Second, 4 * time.Second},
		"b": {2 * time.Second, 4 * time.Second, 6 * time.Second},
	}
	med, lo, hi, ok := pairedRatio(s, "a", "b")
	if diff := cmp.Diff([]any{2.0, 1.5, 2.0, true}, []any{med, lo, hi, ok}); diff != "" {
		t.Errorf("pairedRatio (-want +got):\n%s", diff)
	}
	if _, _, _, ok := pairedRatio(s, "a", "none"); ok {
		t.Error("pairedRatio of a contender that ran no round reports ok")
	}
}
