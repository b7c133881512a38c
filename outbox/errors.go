package outbox

import "fmt"

// ConfigError reports a configuration value that breaks a rule. Every
// constructor validates its whole configuration before it touches the
// database, so a ConfigError means nothing was executed.
type ConfigError struct {
	// Field names the offending field, e.g. "Config.Table".
	Field string
	// Value is the offending value as given.
	Value string
	// Rule says what the value must satisfy.
	Rule string
}

// Error implements error.
func (e *ConfigError) Error() string {
	return fmt.Sprintf("outbox: %s %q: %s", e.Field, e.Value, e.Rule)
}
