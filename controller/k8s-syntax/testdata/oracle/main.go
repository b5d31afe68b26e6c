// Runs apimachinery's own functions over the cases of apimachinery.jsonl and
// prints each case with its "out": the expected results of the Rust tests.
// Run it with regenerate.sh (it builds against the apimachinery version that
// e2e/controlplane/kubernetes pins, the one the real kube-apiserver is built from).
package main

import (
	"bufio"
	"encoding/json"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/api/validation/path"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

type testCase struct {
	F    string              `json:"f"`
	S    string              `json:"s"`
	Sets []map[string]string `json:"sets,omitempty"`
	Out  interface{}         `json:"out"`
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := json.NewEncoder(os.Stdout)
	out.SetEscapeHTML(false)
	var sets []map[string]string
	joined := func(errs []string) interface{} { return strings.Join(errs, "; ") }
	for in.Scan() {
		var c testCase
		if err := json.Unmarshal(in.Bytes(), &c); err != nil {
			panic(err)
		}
		switch c.F {
		case "label_sets": // the label sets every selector is matched against
			sets = c.Sets
			c.Out = nil
		case "IsDNS1123Label":
			c.Out = joined(validation.IsDNS1123Label(c.S))
		case "IsDNS1123Subdomain":
			c.Out = joined(validation.IsDNS1123Subdomain(c.S))
		case "IsDNS1035Label":
			c.Out = joined(validation.IsDNS1035Label(c.S))
		case "IsQualifiedName":
			c.Out = joined(validation.IsQualifiedName(c.S))
		case "IsValidLabelValue":
			c.Out = joined(validation.IsValidLabelValue(c.S))
		case "IsValidPathSegmentName":
			c.Out = joined(path.IsValidPathSegmentName(c.S))
		case "labels.Parse":
			sel, err := labels.Parse(c.S)
			if err != nil {
				c.Out = map[string]interface{}{"error": err.Error()}
				break
			}
			matches := []bool{}
			for _, s := range sets {
				matches = append(matches, sel.Matches(labels.Set(s)))
			}
			c.Out = map[string]interface{}{"string": sel.String(), "matches": matches}
		default:
			panic("unknown function " + c.F)
		}
		if err := out.Encode(c); err != nil {
			panic(err)
		}
	}
	if err := in.Err(); err != nil {
		panic(err)
	}
}
