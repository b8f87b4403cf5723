// Command promql-check parses PromQL expressions with Prometheus' own parser.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	var exprs []string
	if err := json.NewDecoder(bufio.NewReader(os.Stdin)).Decode(&exprs); err != nil {
		fmt.Fprintln(os.Stderr, "stdin must be a JSON list of expressions:", err)
		os.Exit(2)
	}
	p := parser.NewParser(parser.Options{})
	failed := 0
	for i, expr := range exprs {
		if _, err := p.ParseExpr(expr); err != nil {
			fmt.Printf("%d: %v\n", i, err)
			failed++
		}
	}
	if failed > 0 {
		os.Exit(1)
	}
}
