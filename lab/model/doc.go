// Package model holds the formal model of paydedup's payment protocol
// (paydedup.pml, in Promela) and the test that checks it with the spin model
// checker. README.md beside it maps each step of the model to the Go function
// that implements it.
package model
