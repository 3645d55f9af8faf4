package payment

import "strings"

// iso4217 holds the active ISO 4217 currency codes, lower-case as the
// provider expects them.
var iso4217 = func() map[string]struct{} {
	const codes = `aed afn all amd ang aoa ars aud awg azn bam bbd bdt bgn bhd bif bmd bnd bob bov brl bsd btn bwp byn bzd
cad cdf che chf chw clf clp cny cop cou crc cuc cup cve czk djf dkk dop dzd egp ern etb eur fjd fkp gbp gel ghs gip gmd gnf
gtq gyd hkd hnl htg huf idr ils inr iqd irr isk jmd jod jpy kes kgs khr kmf kpw krw kwd kyd kzt lak lbp lkr lrd lsl lyd mad
mdl mga mkd mmk mnt mop mru mur mvr mwk mxn mxv myr mzn nad ngn nio nok npr nzd omr pab pen pgk php pkr pln pyg qar ron rsd
rub rwf sar sbd scr sdg sek sgd shp sle sll sos srd ssp stn svc syp szl thb tjs tmt tnd top try ttd twd tzs uah ugx usd usn
uyi uyu uyw uzs ved ves vnd vuv wst xaf xcd xcg xof xpf yer zar zmw zwg zwl`
	m := make(map[string]struct{}, 200)
	for _, c := range strings.Fields(codes) {
		m[c] = struct{}{}
	}
	return m
}()

// ValidCurrency reports whether c is an active ISO 4217 code in lower case.
func ValidCurrency(c string) bool {
	_, ok := iso4217[c]
	return ok
}
