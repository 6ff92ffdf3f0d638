"""Hot ops: each a triton kernel with a plain-torch twin `<op>_ref` of the same signature. Imports no other speclane
package."""
