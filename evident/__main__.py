from evident.cli import main

main()
