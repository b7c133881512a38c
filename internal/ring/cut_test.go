package ring

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// snapshot is a pg_snapshot: transactions below xmin are done, those
// from xmax on have not begun, xip were running.
type snapshot struct {
	xmin, xmax uint64
	xip        []uint64
}

func (s snapshot) String() string {
	xs := make([]string, len(s.xip))
	for i, x := range s.xip {
		xs[i] = strconv.FormatUint(x, 10)
	}
	return fmt.Sprintf("%d:%d:%s", s.xmin, s.xmax, strings.Join(xs, ","))
}

// visible is pg_visible_in_snapshot.
func (s snapshot) visible(x uint64) bool {
	return x < s.xmin || (x < s.xmax && !slices.Contains(s.xip, x))
}

func parse(t *testing.T, text string) snapshot {
	t.Helper()
	xmin, xmax, xip, err := parseSnapshot(text)
	if err != nil {
		t.Fatal(err)
	}
	return snapshot{xmin, xmax, xip}
}

// history takes two snapshots of transactions that begin in id order
// and end at random: prev, then cur, later.
func history(r *rand.Rand) (prev, cur snapshot) {
	const n = 40
	begin := make([]int, n) // when transaction 3+i began and ended, in steps
	end := make([]int, n)
	for i := range n {
		begin[i] = i
		end[i] = i + 1 + r.IntN(30)
	}
	at := func(step int) snapshot {
		s := snapshot{xmax: 3}
		for i := range n {
			if begin[i] < step {
				s.xmax = uint64(3 + i + 1)
				if end[i] >= step {
					s.xip = append(s.xip, uint64(3+i))
				}
			}
		}
		s.xmin = s.xmax
		if len(s.xip) > 0 {
			s.xmin = s.xip[0]
		}
		return s
	}
	p := r.IntN(n)
	c := p + r.IntN(n)
	return at(p), at(c)
}

// A cut after transaction last sees what the lane's progress saw, and
// what the claim's snapshot saw up to last: nothing the progress saw is
// unseen again, nothing above last the progress had not seen is seen.
func TestCutSeesWhatTheProgressSawAndTheBatchRead(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		prev, cur := history(r)
		for last := prev.xmin; last < cur.xmax; last++ {
			if !cur.visible(last) || prev.visible(last) {
				continue // a batch ends at a transaction it read
			}
			text, err := Cut(prev.String(), cur.String(), int64(last))
			if err != nil {
				t.Fatalf("Cut(%s, %s, %d): %v", prev, cur, last, err)
			}
			cut := parse(t, text)
			for x := uint64(1); x < cur.xmax+2; x++ {
				want := prev.visible(x) || (x <= last && cur.visible(x))
				if cut.visible(x) != want {
					t.Fatalf("Cut(%s, %s, %d) = %s sees %d: %v; want %v", prev, cur, last, text, x, !want, want)
				}
			}
		}
	}
}

// The case the lanes met: the progress saw a transaction running whose
// rows fill the next batch alone, and had seen later ones done.
func TestCutKeepsTheTransactionsTheProgressSawAboveTheCut(t *testing.T) {
	t.Parallel()
	got, err := Cut("980:1000:980,990", "995:1100:995,1050", 980)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff("990:1000:990", got); diff != "" {
		t.Errorf("cut (-want +got):\n%s", diff)
	}
}

func TestCutRefusesWhatIsNotASnapshot(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "1:2", "a:2:", "2:1:", "1:5:7", "1:5:x", "3:5:2"} {
		if _, err := Cut(s, "1:10:", 5); err == nil {
			t.Errorf("Cut(%q, ...): no error", s)
		}
		if _, err := Cut("1:1:", s, 5); err == nil {
			t.Errorf("Cut(..., %q, ...): no error", s)
		}
	}
}
