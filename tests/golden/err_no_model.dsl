block f(x) {
  return x
}
