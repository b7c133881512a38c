package procstat

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

func TestReadTheTestsOwnProcess(t *testing.T) {
	t.Parallel()
	deadline := time.Now().Add(50 * time.Millisecond)
	for time.Now().Before(deadline) { // spend some CPU
	}
	got, ok := Read(filepath.Join("/proc", strconv.Itoa(os.Getpid()), "stat"))
	if !ok || got.Command == "" || got.User+got.System == 0 {
		t.Errorf("Read of this process = %+v, %v; want its command and some CPU", got, ok)
	}
	if _, ok := Read("/proc/nonexistent/stat"); ok {
		t.Error("Read of a missing process succeeded")
	}
	if d := Duration(250); d != 2500*time.Millisecond {
		t.Errorf("Duration(250) = %v", d)
	}
}
