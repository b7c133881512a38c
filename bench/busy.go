package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
)

// busyEnv names the variable that turns the benchmark binary into the
// process -busy starts: one thread that spins until its standard input
// closes.
const busyEnv = "OUTBOXBENCH_BUSY"

// runBusy spins one thread until standard input closes (the benchmark
// that started it ended).
func runBusy() {
	runtime.GOMAXPROCS(2)
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	x := 0
	for {
		x++
	}
}

// startBusy starts the process that keeps one core busy (-busy), as
// another service on the database's machine would. The returned function
// stops it.
func startBusy() (stop func(), err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), busyEnv+"=1")
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the busy process: %w", err)
	}
	return func() {
		_ = in.Close()
		_ = cmd.Wait()
	}, nil
}
