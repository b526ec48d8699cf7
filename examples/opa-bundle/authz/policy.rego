package authz

import rego.v1

default allow := false

# Anyone may read what is under /public.
allow if {
	input.method == "GET"
	input.path[0] == "public"
}

# A user holding the admin role may do anything.
allow if {
	"admin" in data.roles[input.user]
}
