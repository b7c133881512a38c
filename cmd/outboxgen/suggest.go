package main

import (
	"fmt"
	"slices"
)

// contains reports whether list holds s.
func contains(list []string, s string) bool { return slices.Contains(list, s) }

// suggest returns `; did you mean "X"?` naming the word of known nearest
// to s, when it is near enough to be a slip (at most a third of its
// letters edited, and at least one), else "".
func suggest(s string, known []string) string {
	best, bestDist := "", -1
	for _, k := range known {
		if d := editDistance(s, k); bestDist < 0 || d < bestDist {
			best, bestDist = k, d
		}
	}
	if bestDist < 0 || bestDist > max(1, len([]rune(best))/3) {
		return ""
	}
	return fmt.Sprintf("; did you mean %q?", best)
}

// editDistance is the Damerau-Levenshtein distance (optimal string
// alignment) between a and b, in runes: a swap of two neighbours counts
// as one edit.
func editDistance(a, b string) int {
	x, y := []rune(a), []rune(b)
	d := make([][]int, len(x)+1)
	for i := range d {
		d[i] = make([]int, len(y)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(x); i++ {
		for j := 1; j <= len(y); j++ {
			cost := 1
			if x[i-1] == y[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && x[i-1] == y[j-2] && x[i-2] == y[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(x)][len(y)]
}
