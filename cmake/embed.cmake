# Turns a text file into a C array: cmake -DIN=file -DOUT=file.c -DNAME=sym -P embed.cmake
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
file(WRITE "${OUT}.tmp"
  "/* generated from ${IN} by cmake/embed.cmake; do not edit */\n"
  "const char ${NAME}[] = {${body} 0};\n"
  "const unsigned long ${NAME}_len = sizeof ${NAME} - 1;\n")
file(RENAME "${OUT}.tmp" "${OUT}")
